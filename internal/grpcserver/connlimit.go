package grpcserver

import (
	"net"
	"sync"
	"sync/atomic"
)

// reasonConnLimit is the refusal reason of a connection over Limits.MaxConnsPerAddress.
const reasonConnLimit = "max_connections_per_address"

// connLimitListener closes a connection as soon as it is accepted when its peer (peerKey)
// already holds max connections on this listener: nothing is read from it, no TLS handshake
// is started, and no goroutine is left behind. Accept never fails for such a connection, so
// the server's accept loop keeps going.
type connLimitListener struct {
	net.Listener
	name     string // "grpc" or "http", for the refusal log
	max      int
	refusals *refusalLog

	mu   sync.Mutex
	open map[string]int
}

func limitConns(l net.Listener, name string, max int, refusals *refusalLog) net.Listener {
	return &connLimitListener{Listener: l, name: name, max: max, refusals: refusals, open: make(map[string]int)}
}

func (l *connLimitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		key := peerKey(c.RemoteAddr())
		l.mu.Lock()
		n := l.open[key]
		if n < l.max {
			l.open[key] = n + 1
		}
		l.mu.Unlock()
		if n < l.max {
			return &limitedConn{Conn: c, release: func() { l.release(key) }}, nil
		}
		// A reset rather than an orderly close: the refused peer learns at once, and this
		// side keeps no socket in TIME_WAIT for it.
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
		l.refusals.note(l.name, c.RemoteAddr(), reasonConnLimit)
	}
}

func (l *connLimitListener) release(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[key] <= 1 {
		delete(l.open, key)
		return
	}
	l.open[key]--
}

// limitedConn gives its slot back when it is closed, once however often Close is called. It
// hides the *net.TCPConn from grpc-go, which then sets no TCP_USER_TIMEOUT on it; the server's
// keepalive pings (pingAfter, pingTimeout) still close a connection whose peer stopped
// answering.
type limitedConn struct {
	net.Conn
	closed  atomic.Bool
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	if c.closed.CompareAndSwap(false, true) {
		c.release()
	}
	return err
}

// CloseWrite lets net/http half-close a plain HTTP connection after refusing a request whose
// body it did not read, so the client receives the refusal before the connection ends (a
// full close with unread input resets it, and the response may be lost).
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
