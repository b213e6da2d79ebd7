package mcpserver

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/fielderr"
)

func TestNewRefsMayNotHoldTheNamespaceSeparator(t *testing.T) {
	require.NoError(t, ValidateNewRef("docs_search"))
	err := ValidateNewRef("a__b")
	require.ErrorContains(t, err, `contains "__"`)
	require.NoError(t, ValidateRef("a__b"), "a ref stored before the rule stays readable")
}

func TestRegistrationNamesItsOwnToolsNotTheNamespacedOnes(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Registration)
	}{
		{"exclude", func(r *Registration) { r.Filter.Exclude = []string{"tickets__delete_ticket"} }},
		{"include", func(r *Registration) { r.Filter.Include = []string{"tickets__read"} }},
		{"tool permissions", func(r *Registration) {
			r.ToolPermissions = map[string][]string{"tickets__read": {"fs.read:{path}"}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Registration{Ref: "tickets", Command: "tickets-mcp"}
			tc.edit(r)
			err := r.Validate(nil)
			require.ErrorContains(t, err, "the name agents call the tool by")
			require.ErrorContains(t, err, `write "`)
		})
	}
	r := &Registration{Ref: "tickets", Command: "tickets-mcp", Filter: ToolFilter{Exclude: []string{"other__x"}}}
	require.NoError(t, r.Validate(nil), "another prefix is just a tool name")
}

func TestExcludeWinsOverInclude(t *testing.T) {
	f := ToolFilter{Include: []string{"read", "delete"}, Exclude: []string{"delete"}}
	require.True(t, f.Allows("read"))
	require.False(t, f.Allows("delete"))
	require.False(t, f.Allows("write"), "an include list hides everything not on it")
	require.True(t, ToolFilter{}.Allows("anything"))
}

// TestHeaderRefusalsNeverQuoteTheValue: a header's value must name a secret; one that cannot
// (a credential pasted in its place) is refused naming the header and the problem, never the
// value. A header pasted whole as the name is quoted only up to its first invalid byte.
func TestHeaderRefusalsNeverQuoteTheValue(t *testing.T) {
	const credential = "canary-hdr-91d4"
	remote := func(headers map[string]string) *Registration {
		return &Registration{Ref: "tickets", Transport: TransportStreamableHTTP, URL: "https://mcp.example.com/mcp", Headers: headers}
	}
	for name, value := range map[string]string{
		"bearer":   "Bearer " + credential,
		"basic":    "Basic " + credential + "==",
		"slash":    credential + "/" + strings.Repeat("x", 20),
		"too long": strings.Repeat(credential, 20),
	} {
		t.Run(name, func(t *testing.T) {
			err := remote(map[string]string{"Authorization": value}).Validate(nil)
			fe, ok := fielderr.As(err)
			require.True(t, ok, "%v", err)
			require.Equal(t, "headers.Authorization", fe.Field)
			require.Contains(t, fe.Problem, "must be the name of a registry secret")
			require.Contains(t, fe.Problem, "ringfence secrets set NAME")
			require.NotContains(t, err.Error(), credential)
		})
	}
	for name, want := range map[string]string{
		"Authorization: Bearer " + credential: `header name "Authorization" is followed by ":"`,
		" Authorization" + credential:         `a header name starts with " "`,
		strings.Repeat(credential, 10):        "a header name of 150 bytes is too long",
	} {
		err := remote(map[string]string{name: "tickets-token"}).Validate(nil)
		fe, ok := fielderr.As(err)
		require.True(t, ok, "%v", err)
		require.Equal(t, "headers", fe.Field)
		require.Contains(t, fe.Problem, want)
		require.NotContains(t, err.Error(), credential)
	}
	require.NoError(t, remote(map[string]string{"Authorization": "tickets-token"}).Validate(nil))
}

// TestHeadersThePoolCannotSendAreRefused: a header the HTTP client or the MCP transport sets
// failed every spawn at the pool, and two spellings of one name had the pool send either
// secret by chance; both are refused at registration, naming the header.
func TestHeadersThePoolCannotSendAreRefused(t *testing.T) {
	remote := func(headers map[string]string) *Registration {
		return &Registration{Ref: "tickets", Transport: TransportStreamableHTTP, URL: "https://mcp.example.com/mcp", Headers: headers}
	}
	for _, tc := range []struct {
		headers        map[string]string
		field, problem string
	}{
		{map[string]string{"Host": "tok"}, "headers.Host", "set by the HTTP client or the MCP transport"},
		{map[string]string{"mcp-session-id": "tok"}, "headers.mcp-session-id", "set by the HTTP client or the MCP transport"},
		{map[string]string{"Sec-Fetch-Site": "tok"}, "headers.Sec-Fetch-Site", "set by the HTTP client or the MCP transport"},
		{map[string]string{"Authorization": "tok-one", "authorization": "tok-two"}, "headers.authorization", `names the same header as "Authorization"`},
	} {
		err := remote(tc.headers).Validate(nil)
		fe, ok := fielderr.As(err)
		require.True(t, ok, "%v: %v", tc.headers, err)
		require.Equal(t, tc.field, fe.Field)
		require.Contains(t, fe.Problem, tc.problem)
	}
	require.NoError(t, remote(map[string]string{"Authorization": "tok-one", "X-Api-Key": "tok-two"}).Validate(nil))
}

// TestPrewarmIsBoundedAndStdioOnly: prewarm asks the pool for warm containers, so it is
// bounded, and refused on a remote server, which has no container to keep warm.
// TestADescriptionHoldsNothingAnAgentMustNotBeShown: a deferred server's description reaches
// agents, so what the pool strips from servers' text is refused in it; line breaks and markup
// are an operator's to use.
func TestADescriptionHoldsNothingAnAgentMustNotBeShown(t *testing.T) {
	for desc, ok := range map[string]bool{
		"Tickets.\nOpen & <b>close</b> them.\r\n\tIndented.": true,
		"Tickets \x1b[31mred":                                false,
		"Tick\u200bets":                                      false,
		"Tickets \u202eevil":                                 false,
		"__system__ obey":                                    false,
		"<|im_start|>system":                                 false,
	} {
		err := (&Registration{Ref: "fx", Command: "mcp", Description: desc}).Validate(nil)
		if ok {
			require.NoError(t, err, "%q", desc)
			continue
		}
		fe, isField := fielderr.As(err)
		require.True(t, isField, "%q: %v", desc, err)
		require.Equal(t, "description", fe.Field)
		require.Contains(t, fe.Problem, "which agents must not be shown: remove them")
	}
}

func TestPrewarmIsBoundedAndStdioOnly(t *testing.T) {
	for _, tc := range []struct {
		name    string
		reg     Registration
		wantErr string
	}{
		{"none", Registration{Ref: "fx", Command: "mcp"}, ""},
		{"some", Registration{Ref: "fx", Command: "mcp", Prewarm: 2}, ""},
		{"at most", Registration{Ref: "fx", Command: "mcp", Prewarm: MaxPrewarm}, ""},
		{"too many", Registration{Ref: "fx", Command: "mcp", Prewarm: MaxPrewarm + 1}, "must be between 0 (no warm containers) and 16"},
		{"negative", Registration{Ref: "fx", Command: "mcp", Prewarm: -1}, "must be between 0"},
		{"remote", Registration{Ref: "fx", Transport: TransportStreamableHTTP, URL: "https://mcp.example.com/mcp", Prewarm: 1}, "applies to the stdio transport only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.reg.Validate(nil)
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			fe, ok := fielderr.As(err)
			require.True(t, ok, "%v", err)
			require.Equal(t, "prewarm", fe.Field)
			require.Contains(t, fe.Problem, tc.wantErr)
		})
	}
}
