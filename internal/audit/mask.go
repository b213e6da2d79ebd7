package audit

import "github.com/ringfence/ringfence/internal/mcpserver"

// SecretMask replaces every secret value in an audited change: the same fixed mask every
// response and log uses, whatever the secret's length or emptiness, so the trail reveals
// neither.
const SecretMask = mcpserver.SecretMask

// MaskValues returns a copy of m with every value replaced by SecretMask and the keys
// kept, so an audited change still says which env variables or headers were set
// without saying what they were. A nil map stays nil.
func MaskValues(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k := range m {
		out[k] = SecretMask
	}
	return out
}
