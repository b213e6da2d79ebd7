package config

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ringfence/ringfence/internal/humanize"
)

// EnvPrefix starts every environment key.
const EnvPrefix = "RINGFENCE_"

// AliasPrefix starts the seed's own names for the same settings (ZEROTH_SANDBOX__*,
// ZEROTH_SERVICE_ROLES_JSON): a user following the seed's instructions sets them, so every
// RINGFENCE_ key is also read under ZEROTH_. The RINGFENCE_ name wins when both are set.
const AliasPrefix = "ZEROTH_"

// clientEnvKeys are RINGFENCE_* variables a server does not configure itself from: the
// CLI's, which a server ignores instead of refusing because operators export them in the
// same shell they start servers from, and RINGFENCE_CONFIG, read on its own. Test
// switches (RINGFENCE_TEST_*) are ignored too. Every other key must be one of Keys.
var clientEnvKeys = map[string]bool{
	"RINGFENCE_ADDR":            true,
	"RINGFENCE_API_KEY":         true,
	"RINGFENCE_CA_FILE":         true,
	"RINGFENCE_SERVER_NAME":     true,
	"RINGFENCE_SERVER_IDENTITY": true,
	"RINGFENCE_CONFIG":          true,
}

// EnvName is the environment variable for a key: "sandbox.mcp_isolation_image" becomes
// RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE.
func EnvName(key string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "__"))
}

// FlagName is the command-line flag for a key: "sandbox.mcp_isolation_image" becomes
// --sandbox.mcp-isolation-image.
func FlagName(key string) string { return strings.ReplaceAll(key, "_", "-") }

// Load builds the configuration from defaults, the YAML file named by --config or
// RINGFENCE_CONFIG, the environment and the flags in args, then validates it. name is the
// binary's name, for --help and for the checks that depend on the binary (validateFor). A
// --help request returns flag.ErrHelp after printing usage to out.
func Load(name string, args, environ []string, out io.Writer) (*Config, error) {
	return loadConfig(name, args, environ, out, true)
}

// LoadSettings reads the configuration as Load does, refusing what does not parse, but does
// not check that it makes a server that can start: for a command that reads a setting or two
// of the server's configuration on its host (secrets-key rotate: where the key file is), which
// must not ask for the TLS files or peers only the server itself needs.
func LoadSettings(name string, args, environ []string, out io.Writer) (*Config, error) {
	return loadConfig(name, args, environ, out, false)
}

func loadConfig(name string, args, environ []string, out io.Writer, check bool) (*Config, error) {
	cfg := &Config{sources: make(map[string]string)}
	fields := collectFields(reflect.ValueOf(cfg).Elem(), "")
	byKey := make(map[string]field, len(fields))
	for _, f := range fields {
		byKey[f.key] = f
		if f.def != "" {
			if err := f.set(f.def); err != nil {
				return nil, fmt.Errorf("config: bad default for %s: %w", f.key, err) // a bug, not user input
			}
		}
	}

	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	configFile := fs.String("config", "", "optional YAML configuration file (also RINGFENCE_CONFIG)")
	type flagValue struct {
		key string
		raw string
	}
	var flagged []flagValue
	for _, f := range fields {
		fs.Var(&rawFlag{isBool: f.v.Kind() == reflect.Bool, set: func(s string) error {
			flagged = append(flagged, flagValue{f.key, s})
			return nil
		}}, FlagName(f.key), f.usage())
	}
	fs.Usage = func() {
		fmt.Fprintf(out, "Usage of %s:\n\nEvery flag is also an environment variable and a YAML key; flags win over the\nenvironment, which wins over the file. --version prints the build and exits.\n\n", name)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("config: unexpected argument %q: every setting is a --flag (see --help)", fs.Arg(0))
	}

	env, from, warnings := envMap(environ, byKey)
	cfg.Warnings = warnings
	if *configFile == "" {
		*configFile = env["RINGFENCE_CONFIG"]
	}
	// An unknown key, or a value that does not parse (which leaves its key at the default), is
	// reported with every other one, so one start names them all.
	var bad problems
	if *configFile != "" {
		if err := loadFile(*configFile, byKey, cfg.sources, &bad); err != nil {
			return nil, err
		}
	}
	if err := loadEnv(env, from, byKey, cfg.sources, &bad); err != nil {
		return nil, err
	}
	for _, fv := range flagged {
		f := byKey[fv.key]
		cfg.sources[f.key] = "--" + FlagName(f.key)
		if err := f.set(fv.raw); err != nil {
			bad.addValue(f.key, "--"+FlagName(f.key), f.display(fv.raw), err)
		}
	}
	if check {
		bad = append(bad, cfg.check()...)
		bad = append(bad, cfg.validateFor(name)...)
	}
	if err := bad.err(cfg.Source); err != nil {
		return nil, err
	}
	return cfg, nil
}

// envMap returns the RINGFENCE_ variables of environ, with each ZEROTH_ alias of a key read as
// its RINGFENCE_ name (from maps that name to the alias it came from), and a warning for
// every alias that is not used.
func envMap(environ []string, byKey map[string]field) (env, from map[string]string, warnings []string) {
	m := make(map[string]string)
	from = make(map[string]string)
	aliases := make(map[string]string)
	for _, kv := range environ {
		k, v, ok := strings.Cut(kv, "=")
		switch {
		case !ok:
		case strings.HasPrefix(k, EnvPrefix):
			m[k] = v
		case strings.HasPrefix(k, AliasPrefix):
			aliases[k] = v
		}
	}
	byEnv := make(map[string]field, len(byKey))
	for _, f := range byKey {
		byEnv[EnvName(f.key)] = f
	}
	for _, alias := range slices.Sorted(maps.Keys(aliases)) {
		name := EnvPrefix + strings.TrimPrefix(alias, AliasPrefix)
		_, known := byEnv[name]
		switch _, set := m[name]; {
		case !known:
			// Not one of ours: the seed's system has settings Ringfence does not, and the
			// variable may be there for it. Said, not refused.
			warnings = append(warnings, fmt.Sprintf("%s is ignored: it is not the alias of a Ringfence setting (%s)", alias, strings.TrimSuffix(suggest(name, byEnv), " (unset it, or see --help for every key)")))
		case set:
			warnings = append(warnings, fmt.Sprintf("%s is ignored: %s is also set, and wins", alias, name))
		default:
			m[name] = aliases[alias]
			from[name] = alias
		}
	}
	return m, from, warnings
}

// loadEnv sets the keys env names, recording in sources where each came from (a ZEROTH_
// alias; the RINGFENCE_ name, which Source gives for a key it has no entry for, replaces a
// file's value).
func loadEnv(env, from map[string]string, byKey map[string]field, sources map[string]string, bad *problems) error {
	byEnv := make(map[string]field, len(byKey))
	for _, f := range byKey {
		byEnv[EnvName(f.key)] = f
	}
	names := make([]string, 0, len(env))
	for k := range env {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, name := range names {
		f, ok := byEnv[name]
		if !ok {
			if clientEnvKeys[name] || strings.HasPrefix(name, EnvPrefix+"TEST_") {
				continue
			}
			bad.addRule("unknown environment variable "+name, suggest(name, byEnv))
			continue
		}
		source := name
		delete(sources, f.key)
		if alias := from[name]; alias != "" {
			source = alias + ", read as " + name
			sources[f.key] = source
		}
		if err := f.set(env[name]); err != nil {
			bad.addValue(f.key, source, f.display(env[name]), err)
		}
	}
	return nil
}

func loadFile(path string, byKey map[string]field, sources map[string]string, bad *problems) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: read config file: %w", err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("config: config file %s is not valid YAML: %w", path, err)
	}
	return applyYAML(path, "", doc, byKey, sources, bad)
}

func applyYAML(path, prefix string, doc map[string]any, byKey map[string]field, sources map[string]string, bad *problems) error {
	keys := make([]string, 0, len(doc))
	for k := range doc {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		key := prefix + k
		val := doc[k]
		if section, ok := val.(map[string]any); ok {
			if !isSection(key, byKey) {
				bad.addRule(fmt.Sprintf("%s: unknown section %q", path, key), suggestKey(key, byKey))
				continue
			}
			if err := applyYAML(path, key+".", section, byKey, sources, bad); err != nil {
				return err
			}
			continue
		}
		f, ok := byKey[key]
		if !ok {
			bad.addRule(fmt.Sprintf("%s: unknown key %q", path, key), suggestKey(key, byKey))
			continue
		}
		raw, err := yamlScalar(val)
		if err != nil {
			return fmt.Errorf("config: %s: key %q: %w", path, key, err)
		}
		sources[key] = "in " + path
		if err := f.set(raw); err != nil {
			bad.addValue(key, "in "+path, f.display(raw), err)
		}
	}
	return nil
}

// yamlScalar turns a YAML value into the string form every source shares; lists become JSON.
func yamlScalar(v any) (string, error) {
	switch x := v.(type) {
	case nil:
		return "", nil
	case string:
		return x, nil
	case bool, int, int64, uint64, float64:
		return fmt.Sprint(x), nil
	case []any:
		b, err := json.Marshal(x)
		if err != nil {
			return "", err
		}
		return string(b), nil
	default:
		return "", fmt.Errorf("unsupported value of type %T", v)
	}
}

func isSection(key string, byKey map[string]field) bool {
	for k := range byKey {
		if strings.HasPrefix(k, key+".") {
			return true
		}
	}
	return false
}

func suggest(envName string, byEnv map[string]field) string {
	best, bestD := "", 4
	for name := range byEnv {
		if d := humanize.EditDistance(envName, name); d < bestD {
			best, bestD = name, d
		}
	}
	if best == "" {
		// A key written without its section, e.g. RINGFENCE_CERT_FILE for
		// RINGFENCE_TLS__CERT_FILE.
		tail := "__" + strings.TrimPrefix(envName, EnvPrefix)
		for name := range byEnv {
			if strings.HasSuffix(name, tail) && (best == "" || name < best) {
				best = name
			}
		}
	}
	if best != "" {
		return fmt.Sprintf("did you mean %s? (unset it, or see --help for every key)", best)
	}
	return "remove it; --help lists every key"
}

func suggestKey(key string, byKey map[string]field) string {
	best, bestD := "", 4
	for k := range byKey {
		if d := humanize.EditDistance(key, k); d < bestD {
			best, bestD = k, d
		}
	}
	if best != "" {
		return fmt.Sprintf("did you mean %q?", best)
	}
	return "remove it; --help lists every key"
}

// field is one settable key.
type field struct {
	key    string
	v      reflect.Value
	def    string
	help   string
	secret bool
}

func collectFields(v reflect.Value, prefix string) []field {
	var out []field
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		key := sf.Tag.Get("key")
		if key == "" {
			continue
		}
		fv := v.Field(i)
		if fv.Kind() == reflect.Struct && fv.Type() != reflect.TypeFor[time.Duration]() {
			out = append(out, collectFields(fv, prefix+key+".")...)
			continue
		}
		out = append(out, field{
			key:    prefix + key,
			v:      fv,
			def:    sf.Tag.Get("default"),
			help:   sf.Tag.Get("help"),
			secret: sf.Tag.Get("secret") == "true",
		})
	}
	return out
}

func (f field) usage() string {
	u := f.help + " (env " + EnvName(f.key) + ")"
	if f.def != "" {
		u += " (default " + f.def + ")"
	}
	return u
}

// example is ", e.g. <the default>" when the key has a default to show, for a parse error's fix.
func (f field) example() string {
	if f.def == "" {
		return ""
	}
	return ", e.g. " + f.def
}

// display shows a raw value in an error message, hiding secrets.
func (f field) display(raw string) string {
	if f.secret {
		return "<redacted>"
	}
	return strconv.Quote(raw)
}

func (f field) set(raw string) error {
	switch f.v.Interface().(type) {
	case time.Duration:
		d, err := time.ParseDuration(raw)
		if err != nil {
			return errors.New("not a duration: use e.g. 500ms, 2s or 15m")
		}
		f.v.SetInt(int64(d))
		return nil
	case ByteSize:
		n, err := ParseByteSize(raw)
		if err != nil {
			return err
		}
		f.v.SetInt(int64(n))
		return nil
	case []string:
		if strings.TrimSpace(raw) == "" {
			f.v.Set(reflect.ValueOf([]string(nil)))
			return nil
		}
		var list []string
		if err := json.Unmarshal([]byte(raw), &list); err != nil {
			return errors.New(`not a JSON list of strings: use e.g. ["APP_TOKEN","OTHER_KEY"]`)
		}
		f.v.Set(reflect.ValueOf(list))
		return nil
	}
	switch f.v.Kind() {
	case reflect.String:
		f.v.SetString(raw)
	case reflect.Bool:
		b, err := strconv.ParseBool(raw)
		if err != nil {
			return errors.New("not a boolean: use true or false")
		}
		f.v.SetBool(b)
	case reflect.Int, reflect.Int64:
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			return fmt.Errorf("not an integer: use a whole number%s", f.example())
		}
		f.v.SetInt(n)
	case reflect.Float64:
		x, err := strconv.ParseFloat(raw, 64)
		if err != nil {
			return fmt.Errorf("not a number: use a decimal number%s", f.example())
		}
		f.v.SetFloat(x)
	default:
		return fmt.Errorf("unsupported kind %s", f.v.Kind())
	}
	return nil
}

// rawFlag records a flag's raw value; values are applied after the file and the environment.
type rawFlag struct {
	isBool bool
	set    func(string) error
}

func (r *rawFlag) String() string     { return "" }
func (r *rawFlag) Set(s string) error { return r.set(s) }
func (r *rawFlag) IsBoolFlag() bool   { return r.isBool }

// Keys lists every key with its env name, default and help, for documentation.
func Keys() []KeyInfo {
	cfg := &Config{}
	var out []KeyInfo
	for _, f := range collectFields(reflect.ValueOf(cfg).Elem(), "") {
		out = append(out, KeyInfo{Key: f.key, Env: EnvName(f.key), Flag: "--" + FlagName(f.key), Default: f.def, Help: f.help})
	}
	return out
}

// KeyInfo documents one key.
type KeyInfo struct {
	Key, Env, Flag, Default, Help string
}
