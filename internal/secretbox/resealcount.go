package secretbox

// ResealCount is what a re-seal after a key rotation did: values re-sealed under the first
// key, and values no key opens (left as they are: their use fails as before). The registry's
// store and the pool's count with it; the pool's store re-seals through a function its caller
// hands it, and so never holds a Box.
type ResealCount struct{ Resealed, Unopened int }

// One re-seals one sealed value with reseal (Box.Reseal, or a function that calls it) and
// counts it. out is sealed as it is when it is empty, when the first key already opens it, or
// when no key does; changed says whether it was re-sealed.
func (n *ResealCount) One(reseal func(sealed, context []byte) ([]byte, bool, error), sealed, context []byte) (out []byte, changed bool) {
	if len(sealed) == 0 {
		return sealed, false
	}
	out, changed, err := reseal(sealed, context)
	if err != nil {
		n.Unopened++
		return sealed, false
	}
	if changed {
		n.Resealed++
	}
	return out, changed
}

// Add counts what o counted too.
func (n *ResealCount) Add(o ResealCount) {
	n.Resealed += o.Resealed
	n.Unopened += o.Unopened
}
