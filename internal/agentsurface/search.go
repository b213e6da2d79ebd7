package agentsurface

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/humanize"
)

// Tool search bounds.
const (
	// DefaultSearchResults is how many matches Search returns when the caller names no limit.
	DefaultSearchResults = 10
	// MaxSearchResults bounds one search's matches.
	MaxSearchResults = 50
	// MaxQueryBytes bounds a query (tool_search's schema says so to the model).
	MaxQueryBytes = 512
	// maxQueryTerms bounds the words of a query that count.
	maxQueryTerms = 32
	// maxListedServers bounds the deferred servers tool_search's description names.
	maxListedServers = 64
	// maxServerDescription bounds each server's description there.
	maxServerDescription = 300
)

// Match is one tool Search found, with its score (higher is better).
type Match struct {
	Tool  Tool
	Score int
}

// Search ranks the agent's deferred tools that pass every filter (loaded or not) against
// query, optionally only server's: each word of the query scores where it occurs, in the
// tool's name (most), its title, then its description, a whole word more than part of one;
// the whole query equal to the tool's name scores most. Ties go by name, so the same query
// over the same surface always answers the same. Tools that match nothing are left out.
// limit <= 0 means DefaultSearchResults; it is at most MaxSearchResults.
func (s *Surface) Search(query, server string, limit int) []Match {
	if limit <= 0 {
		limit = DefaultSearchResults
	}
	limit = min(limit, MaxSearchResults)
	query = clipUTF8(query, MaxQueryBytes)
	terms := queryTerms(query)
	whole := strings.ToLower(strings.TrimSpace(query))
	if len(terms) == 0 {
		return nil
	}
	var out []Match
	for _, d := range s.decisions {
		t := d.Tool
		searchable := d.Outcome == NotLoaded || d.Outcome == Visible && t.Deferred
		if !searchable || server != "" && t.ServerRef != server {
			continue
		}
		if score := scoreTool(t, terms, whole); score > 0 {
			out = append(out, Match{Tool: *t, Score: score})
		}
	}
	slices.SortStableFunc(out, func(x, y Match) int {
		if x.Score != y.Score {
			return y.Score - x.Score
		}
		return strings.Compare(x.Tool.Name, y.Tool.Name)
	})
	if len(out) > limit {
		out = out[:limit]
	}
	return out
}

// Field weights of a query word: a whole word, then part of one.
var (
	nameWeights        = [2]int{6, 3}
	titleWeights       = [2]int{4, 2}
	descriptionWeights = [2]int{2, 1}
)

// wholeQueryBonus is the score of a query that is exactly the tool's name (its binding name or
// the server's name for it).
const wholeQueryBonus = 20

func scoreTool(t *Tool, terms []string, whole string) int {
	name := strings.ToLower(t.Name + " " + t.ToolName)
	title := strings.ToLower(t.Title)
	desc := strings.ToLower(t.Description)
	nameWords, titleWords, descWords := words(name), words(title), words(desc)
	score := 0
	for _, term := range terms {
		score += fieldScore(term, name, nameWords, nameWeights)
		score += fieldScore(term, title, titleWords, titleWeights)
		score += fieldScore(term, desc, descWords, descriptionWeights)
	}
	if whole == strings.ToLower(t.Name) || whole == strings.ToLower(t.ToolName) {
		score += wholeQueryBonus
	}
	return score
}

func fieldScore(term, text string, textWords map[string]bool, w [2]int) int {
	switch {
	case textWords[term]:
		return w[0]
	case strings.Contains(text, term):
		return w[1]
	}
	return 0
}

// queryTerms are the distinct lower-case words of a query, in order; words of one character
// count only when the query has nothing longer.
func queryTerms(query string) []string {
	var long, short []string
	for _, w := range splitWords(strings.ToLower(query)) {
		switch {
		case utf8.RuneCountInString(w) > 1 && !slices.Contains(long, w):
			long = append(long, w)
		case utf8.RuneCountInString(w) == 1 && !slices.Contains(short, w):
			short = append(short, w)
		}
	}
	if len(long) == 0 {
		long = short
	}
	if len(long) > maxQueryTerms {
		long = long[:maxQueryTerms]
	}
	return long
}

func words(s string) map[string]bool {
	out := make(map[string]bool)
	for _, w := range splitWords(s) {
		out[w] = true
	}
	return out
}

// splitWords splits at everything that is not a letter or a digit, so read_file, read-file
// and "read file" are the same two words.
func splitWords(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) })
}

// toolSearch is the tool_search entry for the agent's deferred servers: its description names
// them with their registrations' descriptions, which is how the model learns what it can load.
func toolSearch(deferred []DeferredServer, strict bool) *Tool {
	refs := make([]any, len(deferred))
	var b strings.Builder
	b.WriteString("Find tools that load on demand and load them for the rest of the run: give a few words of what you need (query) and, " +
		"optionally, the one server to search. Call a tool it returns by the name it gives. The servers whose tools load on demand:")
	for i, d := range deferred {
		refs[i] = d.Ref
		if i == maxListedServers {
			fmt.Fprintf(&b, "\n- and %d more", len(deferred)-maxListedServers)
			continue
		}
		if i > maxListedServers {
			continue
		}
		desc := strings.Join(strings.Fields(clipUTF8(d.Description, maxServerDescription)), " ")
		if desc == "" {
			desc = "(no description)"
		}
		fmt.Fprintf(&b, "\n- %s: %s", d.Ref, desc)
	}
	schema := map[string]any{
		"type": "object",
		"properties": map[string]any{
			"query": map[string]any{"type": "string", "minLength": 1, "maxLength": MaxQueryBytes,
				"description": "Words to look for in the tools' names, titles and descriptions."},
			"server": map[string]any{"type": "string", "enum": refs, "description": "Search only this server's tools."},
		},
		"required":             []any{"query"},
		"additionalProperties": false,
	}
	raw, _ := json.Marshal(schema)
	t := &Tool{
		Name: graph.ToolSearchName, Kind: KindToolSearch, Title: "Tool search", Description: b.String(),
		InputSchema: raw, Annotations: json.RawMessage(`{"openWorldHint":false,"readOnlyHint":true}`),
	}
	if strict {
		if s, err := Strict(raw); err == nil {
			t.InputSchema, t.Strict = s, true
		}
	}
	return t
}

// clipUTF8 cuts s to at most n bytes without splitting a character.
func clipUTF8(s string, n int) string { return humanize.Cut(s, n, "") }
