package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"
)

// argsExample is the shape --args takes, quoted as bash and zsh both keep it.
const argsExample = `--args '{"path":"/handbook/leave.md"}'`

// parseArgs reads --args as the JSON object a tool call takes. Its errors say where the JSON
// breaks (the byte offset, with the text around it), and show an example, since the usual
// cause is the shell: unquoted, bash and zsh strip the double quotes from the keys.
func parseArgs(raw string) (*structpb.Struct, error) {
	if strings.TrimSpace(raw) == "" {
		return nil, usagef("--args is empty: give {} for a call without arguments\ne.g. %s", argsExample)
	}
	var v any
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		var syn *json.SyntaxError
		switch {
		case errors.As(err, &syn) && strings.Contains(syn.Error(), "unexpected end"):
			return nil, usagef("--args is not valid JSON: it ends early, after byte %d (a } or \" missing?)\ne.g. %s", syn.Offset, argsExample)
		case errors.As(err, &syn):
			msg := fmt.Sprintf("--args is not valid JSON: %v at byte %d:\n  %s", syn, syn.Offset, pointAt(raw, int(syn.Offset)))
			if !strings.Contains(raw, `"`) && strings.Contains(raw, ":") {
				msg += "\nthe keys have no double quotes: did the shell remove them? Put the whole object in single quotes"
			}
			return nil, usagef("%s\ne.g. %s", msg, argsExample)
		}
		return nil, usagef("--args is not valid JSON: %v\ne.g. %s", err, argsExample)
	}
	if _, ok := v.(map[string]any); !ok {
		return nil, usagef("--args must be a JSON object of the tool's arguments, not %s\ne.g. %s", jsonKind(v), argsExample)
	}
	out := &structpb.Struct{}
	if err := out.UnmarshalJSON([]byte(raw)); err != nil {
		return nil, usagef("--args: %v\ne.g. %s", err, argsExample)
	}
	return out, nil
}

// pointAt shows the text of raw around byte offset off (json's offsets count the bytes read,
// so the fault is the byte before it) with a caret under it.
func pointAt(raw string, off int) string {
	at := max(0, min(off-1, len(raw)))
	from, to := max(0, at-30), min(len(raw), at+30)
	line := strings.NewReplacer("\n", " ", "\t", " ").Replace(raw[from:to])
	return line + "\n  " + strings.Repeat(" ", at-from) + "^"
}

func jsonKind(v any) string {
	switch v.(type) {
	case []any:
		return "a list"
	case string:
		return "a string"
	case float64:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return "that"
}
