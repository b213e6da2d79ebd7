package mcpgate

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strconv"
	"sync"

	"github.com/ringfence/ringfence/mcpgate/mcpdecl/jcs"
)

// Digest is ResultDigest of the result: what a record of the call can hold to tie it to what
// the caller received, without a copy of it.
func (r *Result) Digest() (string, int64, error) {
	return ResultDigest(r.Content, r.StructuredContent, r.IsError)
}

// ResultDigest is the digest of a tool call's result as its caller receives it (content and
// structured content checked and sanitized), as Ringfence's audit records have it
// (result_digest and result_size): "sha256:" and the hex SHA-256 of the RFC 8785 (JCS)
// canonical JSON of {"content": [...], "isError": bool, "structuredContent": {...}}, where
// content is [] when there is none and structuredContent is left out when there is none or it
// is empty (an MCP server sends no empty one), and the size of that canonical JSON in bytes.
// Anyone can recompute it from the result they received, in any language (Ringfence's
// docs/api.md, "Result digests"). It is computed in one pass over the result.
func ResultDigest(content []map[string]any, structured map[string]any, isError bool) (string, int64, error) {
	bp := resultBufs.Get().(*[]byte)
	defer func() {
		if cap(*bp) <= maxPooledResultBuf {
			resultBufs.Put(bp)
		}
	}()
	b, err := canonicalResult((*bp)[:0], content, structured, isError)
	if errors.Is(err, jcs.ErrType) {
		// A value no JSON decoder makes (a result a program built itself): canonicalized from
		// its JSON encoding, as the wire carries it.
		b, err = canonicalResultJSON(content, structured, isError)
	}
	if err != nil {
		return "", 0, err
	}
	*bp = b[:0]
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:]), int64(len(b)), nil
}

// canonicalResult appends the canonical JSON of a result (ResultDigest) to dst. Its members
// are written in JCS order: content, isError, structuredContent.
func canonicalResult(dst []byte, content []map[string]any, structured map[string]any, isError bool) ([]byte, error) {
	var err error
	// Each item is appended on its own, its depth counted from itself as the output checks
	// count it (sanitize.MaxDepth): counted from the list, an item as deep as is delivered
	// would have no canonical form.
	dst = append(dst, `{"content":[`...)
	for i, item := range content {
		if i > 0 {
			dst = append(dst, ',')
		}
		if dst, err = jcs.AppendValue(dst, item); err != nil {
			return nil, err
		}
	}
	dst = append(dst, `],"isError":`...)
	dst = strconv.AppendBool(dst, isError)
	if len(structured) > 0 {
		dst = append(dst, `,"structuredContent":`...)
		if dst, err = jcs.AppendValue(dst, structured); err != nil {
			return nil, err
		}
	}
	return append(dst, '}'), nil
}

// canonicalResultJSON is canonicalResult by way of the result's JSON encoding.
func canonicalResultJSON(content []map[string]any, structured map[string]any, isError bool) ([]byte, error) {
	if content == nil {
		content = []map[string]any{}
	}
	raw, err := json.Marshal(struct {
		Content           []map[string]any `json:"content"`
		IsError           bool             `json:"isError"`
		StructuredContent map[string]any   `json:"structuredContent,omitempty"`
	}{content, isError, structured})
	if err != nil {
		return nil, err
	}
	return jcs.Canonicalize(raw)
}

// resultBufs are the buffers results are canonicalized in for their digest; one larger than
// maxPooledResultBuf is left to the collector.
var resultBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

const maxPooledResultBuf = 1 << 20
