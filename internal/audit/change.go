package audit

import (
	"bytes"
	"container/heap"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
)

// ShortenedKey is set to true at the top of a change BoundChange had to shorten, so a
// reader can tell a shortened change from a whole one without searching it.
const ShortenedKey = "shortened"

// OmittedKey marks the summary that stands in for a value BoundChange left out; its value
// says what was left out: "string", "list" or "object".
const OmittedKey = "omitted"

// minShortened is the smallest value (in encoded bytes) BoundChange replaces: a summary is
// about 130 bytes, so replacing anything much smaller would save little and lose a value.
const minShortened = 512

// markerRoom is what the top-level marker may add to a shortened change:
// `"shortened":true,` in an object, or `{"shortened":true,"change":…}` around anything else.
const markerRoom = 32

// BoundChange returns an admin change as the spool stores it (compact, with <, > and &
// escaped as encoding/json writes them) and at most MaxChangeBytes long, so a producer
// never fails to record a change only because the change is large.
//
// A change that fits is returned whole. One that does not is shortened: its largest
// strings, lists and objects, the innermost first, are each replaced by a summary
//
//	{"omitted": "list", "count": 64, "bytes": 262400, "sha256": "…"}
//
// until the rest fits, and the top-level object gains "shortened": true (a change that is
// not an object is wrapped as {"shortened": true, "change": …}). count is the number of
// elements or keys; bytes and sha256 are the length and SHA-256 of a string's UTF-8 text,
// or of a list's or object's compact JSON with object keys sorted and nothing
// HTML-escaped (as Go's encoding/json writes it with SetEscapeHTML(false)), so anyone
// holding the full value can check it against the record. Object keys of a shortened
// change come out sorted.
//
// BoundChange never sees a secret: change must already be masked (SecretMask), and the
// summaries are taken over the masked form.
func BoundChange(change json.RawMessage) (json.RawMessage, error) {
	return boundChange(change, MaxChangeBytes)
}

func boundChange(change json.RawMessage, limit int) (json.RawMessage, error) {
	if len(change) == 0 {
		return nil, nil
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, change); err != nil {
		return nil, invalid("admin.change is not valid JSON")
	}
	var stored bytes.Buffer
	json.HTMLEscape(&stored, compact.Bytes())
	if stored.Len() <= limit {
		return stored.Bytes(), nil
	}
	dec := json.NewDecoder(bytes.NewReader(compact.Bytes()))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, invalid("admin.change is not valid JSON")
	}
	out, err := shorten(v, limit)
	if err != nil {
		return nil, err
	}
	if len(out) > limit {
		return nil, invalid(fmt.Sprintf("admin.change is %d bytes after shortening, limit %d", len(out), limit))
	}
	return out, nil
}

// node is one string, list or object of a change being shortened, with its encoded size as
// the change currently stands (shrinking as values inside it are replaced).
type node struct {
	val    any
	parent *node
	keys   []string // an object's keys, sorted; kids follow them
	kids   []*node
	size   int
	// candidate: large enough to replace. pending counts the candidates inside it not yet
	// replaced: only a candidate with none left is replaced, so the innermost values go first
	// and an outer one only when shortening everything inside it was not enough.
	candidate bool
	pending   int
	// height orders the replacements: 0 for a value with no candidate inside it, one more
	// than the highest candidate inside it otherwise. Lower heights go first, so a list of
	// long args loses the args one by one before it is summarized as a list.
	height  int
	summary map[string]any
}

// shorten replaces values of v by summaries, among those with no replaceable value left
// inside them the innermost and then the largest first, until v encodes within limit with
// its marker.
func shorten(v any, limit int) ([]byte, error) {
	root, err := build(v, nil)
	if err != nil {
		return nil, err
	}
	var ready sizeHeap
	var walk func(n *node)
	walk = func(n *node) {
		for _, k := range n.kids {
			walk(k)
		}
		if n.candidate && n.pending == 0 && n != root {
			ready = append(ready, n)
		}
	}
	walk(root)
	heap.Init(&ready)

	budget := limit - markerRoom
	for root.size > budget && ready.Len() > 0 {
		n := heap.Pop(&ready).(*node)
		sum, err := summarize(n.val)
		if err != nil {
			return nil, err
		}
		saved := 0
		if size, err := encodedSize(sum); err != nil {
			return nil, err
		} else if size < n.size {
			n.summary, saved = sum, n.size-size
		}
		for p := n.parent; p != nil; p = p.parent {
			p.size -= saved
			p.pending--
			if p.candidate && p.pending == 0 && p != root {
				heap.Push(&ready, p)
			}
		}
	}
	if root.size <= budget {
		var out any
		if obj, ok := rebuild(root).(map[string]any); ok {
			obj[ShortenedKey] = true
			out = obj
		} else {
			out = map[string]any{ShortenedKey: true, "change": rebuild(root)}
		}
		b, err := json.Marshal(out)
		if err != nil || len(b) <= limit {
			return b, err
		}
	}
	// Nothing inside was enough (many small values): summarize the whole change.
	sum, err := summarize(v)
	if err != nil {
		return nil, err
	}
	sum[ShortenedKey] = true
	return json.Marshal(sum)
}

// build mirrors v as nodes and sizes each as json.Marshal will write it.
func build(v any, parent *node) (*node, error) {
	n := &node{val: v, parent: parent}
	switch t := v.(type) {
	case []any:
		n.size = 2 + max(len(t)-1, 0)
		for _, e := range t {
			k, err := build(e, n)
			if err != nil {
				return nil, err
			}
			n.kids = append(n.kids, k)
			n.size += k.size
		}
	case map[string]any:
		n.size = 2 + max(len(t)-1, 0)
		n.keys = make([]string, 0, len(t))
		for key := range t {
			n.keys = append(n.keys, key)
		}
		sort.Strings(n.keys)
		for _, key := range n.keys {
			k, err := build(t[key], n)
			if err != nil {
				return nil, err
			}
			ks, err := encodedSize(key)
			if err != nil {
				return nil, err
			}
			n.kids = append(n.kids, k)
			n.size += ks + 1 + k.size
		}
	default:
		size, err := encodedSize(v)
		if err != nil {
			return nil, err
		}
		n.size = size
	}
	if _, scalar := v.(string); (scalar || n.kids != nil) && n.size >= minShortened {
		n.candidate = true
	}
	for _, k := range n.kids {
		n.pending += k.pending
		if k.candidate {
			n.pending++
			n.height = max(n.height, k.height+1)
		} else {
			n.height = max(n.height, k.height)
		}
	}
	return n, nil
}

// rebuild is the change with every replaced value's summary in its place.
func rebuild(n *node) any {
	if n.summary != nil {
		return n.summary
	}
	switch t := n.val.(type) {
	case []any:
		out := make([]any, len(t))
		for i, k := range n.kids {
			out[i] = rebuild(k)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(t))
		for i, k := range n.kids {
			out[n.keys[i]] = rebuild(k)
		}
		return out
	}
	return n.val
}

// summarize is the summary that stands in for v.
func summarize(v any) (map[string]any, error) {
	var text []byte
	sum := map[string]any{}
	switch t := v.(type) {
	case string:
		sum[OmittedKey] = "string"
		text = []byte(t)
	case []any:
		sum[OmittedKey], sum["count"] = "list", len(t)
	case map[string]any:
		sum[OmittedKey], sum["count"] = "object", len(t)
	default:
		sum[OmittedKey] = "value"
	}
	if text == nil {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil {
			return nil, fmt.Errorf("audit: shorten change: %w", err)
		}
		text = bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	}
	digest := sha256.Sum256(text)
	sum["bytes"], sum["sha256"] = len(text), hex.EncodeToString(digest[:])
	return sum, nil
}

func encodedSize(v any) (int, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return 0, fmt.Errorf("audit: shorten change: %w", err)
	}
	return len(b), nil
}

// sizeHeap orders the values ready to be replaced: innermost first, then largest first.
type sizeHeap []*node

func (h sizeHeap) Len() int { return len(h) }
func (h sizeHeap) Less(i, j int) bool {
	if h[i].height != h[j].height {
		return h[i].height < h[j].height
	}
	return h[i].size > h[j].size
}
func (h sizeHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *sizeHeap) Push(x any)   { *h = append(*h, x.(*node)) }
func (h *sizeHeap) Pop() any {
	old := *h
	n := old[len(old)-1]
	*h = old[:len(old)-1]
	return n
}
