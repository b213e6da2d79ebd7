package mcpserver

import (
	"maps"
	"slices"

	"github.com/ringfence/ringfence/internal/fielderr"
)

// RestoreMasked returns values with every value that is SecretMask replaced by stored's
// value for the same key. Every response shows secret values as the mask, so a client that
// read a registration or draft and sends it back means "keep what is stored"; storing the
// mask itself would silently replace the secret. A masked key with nothing stored behind it
// is refused, naming field.key, rather than stored as the mask. values is not modified;
// without a masked value it is returned as it is.
func RestoreMasked(field string, values, stored map[string]string) (map[string]string, error) {
	if !HasMask(values) {
		return values, nil
	}
	var masked []string
	for k, v := range values {
		if v == SecretMask {
			masked = append(masked, k)
		}
	}
	slices.Sort(masked) // the same key is named every time
	out := maps.Clone(values)
	for _, k := range masked {
		v, ok := stored[k]
		if !ok {
			return nil, fielderr.New(field+"."+k, "is the mask %q, and no value is stored for it: send the value itself", SecretMask)
		}
		out[k] = v
	}
	return out, nil
}

// HasMask reports whether any of values is SecretMask: a caller that must look the stored
// values up first can skip that when there is nothing to restore.
func HasMask(values map[string]string) bool {
	for _, v := range values {
		if v == SecretMask {
			return true
		}
	}
	return false
}
