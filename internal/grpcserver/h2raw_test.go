package grpcserver

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2raw is an HTTP/2 client that speaks frames, as an attacker would: it opens streams, says
// how long its messages are and sends what it likes, and reports every frame the server
// sends. Writes happen on the test's goroutine, reads on one of its own.
type h2raw struct {
	t      testing.TB
	conn   net.Conn
	fr     *http2.Framer
	enc    *hpack.Encoder
	hbuf   bytes.Buffer
	events chan h2event
}

// h2event is one frame from the server, copied out of the framer (which reuses its frames),
// or the end of the connection (err set).
type h2event struct {
	typ       http2.FrameType
	stream    uint32
	fields    map[string]string // HEADERS
	endStream bool
	code      http2.ErrCode // RST_STREAM, GOAWAY
	debug     string        // GOAWAY
	incr      uint32        // WINDOW_UPDATE
	settings  map[http2.SettingID]uint32
	ack       bool
	ping      [8]byte
	err       error
}

// dialH2 connects to addr (over TLS when cfg is set), sends the client preface and empty
// SETTINGS, and starts reading.
func dialH2(t testing.TB, addr string, cfg *tls.Config) *h2raw {
	t.Helper()
	var conn net.Conn
	var err error
	if cfg != nil {
		cfg = cfg.Clone()
		cfg.NextProtos = []string{"h2"}
		conn, err = tls.Dial("tcp", addr, cfg)
	} else {
		conn, err = net.Dial("tcp", addr)
	}
	if err != nil { // refused so fast that the dial saw it
		h := &h2raw{t: t, events: make(chan h2event, 1)}
		h.events <- h2event{err: err}
		close(h.events)
		return h
	}
	t.Cleanup(func() { conn.Close() })
	h := &h2raw{t: t, conn: conn, fr: http2.NewFramer(conn, conn), events: make(chan h2event, 4096)}
	h.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	h.fr.MaxHeaderListSize = 1 << 20
	h.enc = hpack.NewEncoder(&h.hbuf)
	// A server that refuses the connection may have closed it already: the reader reports that.
	if _, err := conn.Write([]byte(http2.ClientPreface)); err == nil {
		_ = h.fr.WriteSettings()
	}
	go h.read()
	return h
}

func (h *h2raw) read() {
	defer close(h.events)
	for {
		f, err := h.fr.ReadFrame()
		if err != nil {
			h.events <- h2event{err: err}
			return
		}
		ev := h2event{typ: f.Header().Type, stream: f.Header().StreamID}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			ev.fields = make(map[string]string)
			for _, hf := range f.Fields {
				ev.fields[hf.Name] = hf.Value
			}
			ev.endStream = f.StreamEnded()
		case *http2.DataFrame:
			ev.endStream = f.StreamEnded()
		case *http2.RSTStreamFrame:
			ev.code = f.ErrCode
		case *http2.GoAwayFrame:
			ev.code, ev.debug = f.ErrCode, string(f.DebugData())
		case *http2.WindowUpdateFrame:
			ev.incr = f.Increment
		case *http2.SettingsFrame:
			ev.ack = f.IsAck()
			ev.settings = make(map[http2.SettingID]uint32)
			_ = f.ForeachSetting(func(s http2.Setting) error { ev.settings[s.ID] = s.Val; return nil })
		case *http2.PingFrame:
			ev.ack, ev.ping = f.IsAck(), f.Data
		}
		h.events <- ev
	}
}

// next returns the server's next frame, or false when none came within wait (which bounds how
// long a test waits for something that should happen; no test asserts on how long it took).
func (h *h2raw) next(wait time.Duration) (h2event, bool) {
	select {
	case ev, ok := <-h.events:
		if !ok {
			return h2event{err: net.ErrClosed}, true
		}
		return ev, true
	case <-time.After(wait):
		return h2event{}, false
	}
}

// answer acknowledges the server's SETTINGS and PINGs, as a well-behaved peer does.
func (h *h2raw) answer(ev h2event) {
	switch {
	case ev.typ == http2.FrameSettings && !ev.ack:
		require.NoError(h.t, h.fr.WriteSettingsAck())
	case ev.typ == http2.FramePing && !ev.ack:
		require.NoError(h.t, h.fr.WritePing(true, ev.ping))
	}
}

// open starts a gRPC call of method on stream id with metadata md, and sends the five-byte
// length prefix of a message of announce bytes, but none of its body.
func (h *h2raw) open(id uint32, method string, md map[string]string, announce uint32) {
	h.t.Helper()
	h.hbuf.Reset()
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":path", method}, {":authority", "ringfence"},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		require.NoError(h.t, h.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}))
	}
	for k, v := range md {
		require.NoError(h.t, h.enc.WriteField(hpack.HeaderField{Name: k, Value: v}))
	}
	// Frames of at most 16 KiB, the size every HTTP/2 peer accepts: HEADERS, then CONTINUATION.
	block := h.hbuf.Bytes()
	first := block[:min(len(block), 16<<10)]
	block = block[len(first):]
	require.NoError(h.t, h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndHeaders: len(block) == 0}))
	for len(block) > 0 {
		next := block[:min(len(block), 16<<10)]
		block = block[len(next):]
		require.NoError(h.t, h.fr.WriteContinuation(id, len(block) == 0, next))
	}
	var prefix [5]byte
	binary.BigEndian.PutUint32(prefix[1:], announce)
	require.NoError(h.t, h.fr.WriteData(id, false, prefix[:]))
}

// grpcStatus is the grpc-status of a trailers-only answer, or -1.
func (ev h2event) grpcStatus() int {
	if ev.typ != http2.FrameHeaders || ev.fields["grpc-status"] == "" {
		return -1
	}
	n, err := strconv.Atoi(ev.fields["grpc-status"])
	if err != nil {
		return -1
	}
	return n
}

// streamResult is what became of one stream a test opened.
type streamResult struct {
	answer *h2event // the server's last word on it: a trailers-only HEADERS, or RST_STREAM
	asked  bool     // the server opened the stream's window: it was reading the body
	sent   int      // body bytes sent after the length prefix
	window int64
}

// pump sends body on each of ids (whose length prefixes are sent), 16 KiB at a time and only as
// far as the server's flow-control windows allow, as a slow sender does; end closes a stream
// once all of body is sent. It returns when every stream has its answer, the connection ends,
// or the server has sent nothing for quiet; the last event is returned too.
func (h *h2raw) pump(ids []uint32, body []byte, end bool, quiet time.Duration) (map[uint32]*streamResult, h2event) {
	h.t.Helper()
	const initialWindow = 65535
	res := make(map[uint32]*streamResult, len(ids))
	for _, id := range ids {
		res[id] = &streamResult{window: initialWindow - 5}
	}
	connWindow := int64(initialWindow - 5*len(ids))
	open := len(ids)
	send := func() {
		for _, id := range ids {
			r := res[id]
			if r.answer != nil || r.sent >= len(body) {
				continue
			}
			n := int(min(int64(16<<10), int64(len(body)-r.sent), r.window, connWindow))
			if n <= 0 {
				continue
			}
			last := end && r.sent+n == len(body)
			if err := h.fr.WriteData(id, last, body[r.sent:r.sent+n]); err != nil {
				return // the server closed the connection; the reader reports it
			}
			r.sent += n
			r.window -= int64(n)
			connWindow -= int64(n)
		}
	}
	handle := func(ev h2event) bool {
		h.answer(ev)
		switch ev.typ {
		case http2.FrameSettings:
			if v, ok := ev.settings[http2.SettingInitialWindowSize]; ok && !ev.ack {
				for _, r := range res {
					r.window += int64(v) - initialWindow
				}
			}
		case http2.FrameWindowUpdate:
			if ev.stream == 0 {
				connWindow += int64(ev.incr)
			} else if r := res[ev.stream]; r != nil {
				r.window += int64(ev.incr)
				r.asked = true
			}
		case http2.FrameHeaders, http2.FrameRSTStream:
			if r := res[ev.stream]; r != nil && r.answer == nil && (ev.endStream || ev.typ == http2.FrameRSTStream) {
				r.answer = &ev
				open--
			}
		case http2.FrameGoAway:
			return false
		}
		return ev.err == nil
	}
	send()
	var last h2event
	for open > 0 {
		ev, ok := h.next(quiet)
		if !ok {
			break
		}
		last = ev
		if !handle(ev) {
			break
		}
		for drained := false; !drained; {
			select {
			case ev, ok := <-h.events:
				if !ok {
					return res, h2event{err: net.ErrClosed}
				}
				last = ev
				if !handle(ev) {
					return res, last
				}
			default:
				drained = true
			}
		}
		send()
	}
	return res, last
}
