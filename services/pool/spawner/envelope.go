package spawner

// envelope follows the top level of one JSON-RPC message as its bytes arrive, keeping only
// what routes it: the raw "id", whether it has a "method", an "error", and where its "result"
// lies. It needs no more memory than that whatever the message's size, so the stdout filter
// can learn what a message too large to hold is (an answer, and to which request) while it
// discards it, and the connection can hand on a large result as the bytes the server wrote.
//
// It checks the structure only as far as routing needs (brackets, strings, the members of the
// top-level object); the filter validates a message it delivers whole, and a message it
// skips is only ever answered with a failure.
type envelope struct {
	off      int // bytes fed so far
	st       envState
	depth    int  // containers open inside the top-level object's value being read
	inStr    bool // inside a string
	esc      bool // after a backslash inside a string
	inKey    bool // the string is a member name of the top-level object
	scalar   bool // the value being read is a number or literal at the top level
	member   member
	valStart int
	key      [8]byte
	keyLen   int

	// What the message is, as far as fed.
	id          []byte // the raw "id" value, up to maxEnvelopeID bytes
	idTooLong   bool
	hasID       bool
	idDone      bool // the "id" value was read whole
	hasMethod   bool
	hasResult   bool
	hasError    bool
	resultStart int
	resultEnd   int
	closed      bool // the top-level object ended
	bad         bool // not one JSON object
}

type envState uint8

const (
	envStart   envState = iota // before the object
	envKey                     // a member name or '}' (after '{' or ',')
	envColon                   // ':' after a member name
	envValue                   // a member's value
	envInValue                 // inside a member's value
	envNext                    // ',' or '}' after a value
	envEnd                     // after the object
)

type member uint8

const (
	memberOther member = iota
	memberID
	memberMethod
	memberResult
	memberError
)

// maxEnvelopeID bounds the "id" kept: ids are numbers or short strings.
const maxEnvelopeID = 128

// feed reads the next bytes of the message.
func (e *envelope) feed(p []byte) {
	for i := 0; i < len(p) && !e.bad; i++ {
		c := p[i]
		pos := e.off + i
		if e.inStr {
			if e.member == memberID && !e.inKey && e.depth == 0 {
				e.keepID(c)
			}
			switch {
			case e.esc:
				e.esc = false
			case c == '\\':
				e.esc = true
			case c == '"':
				e.inStr = false
				if e.inKey {
					e.inKey = false
					e.st = envColon
				} else if e.depth == 0 {
					e.endValue(pos + 1)
				}
			case e.inKey:
				if e.keyLen < len(e.key) {
					e.key[e.keyLen] = c
				}
				e.keyLen++
			}
			continue
		}
		if e.st == envInValue && e.scalar && (c == ',' || c == '}' || isSpace(c)) {
			e.endValue(pos)
		}
		if e.st == envInValue && e.member == memberID {
			e.keepID(c)
		}
		e.step(c, pos)
	}
	e.off += len(p)
}

func (e *envelope) step(c byte, pos int) {
	switch e.st {
	case envStart, envEnd:
		switch {
		case isSpace(c):
		case c == '{' && e.st == envStart:
			e.st = envKey
		default:
			e.bad = true
		}
	case envKey:
		switch {
		case isSpace(c):
		case c == '"':
			e.inStr, e.inKey, e.keyLen = true, true, 0
		case c == '}':
			e.closed, e.st = true, envEnd
		default:
			e.bad = true
		}
	case envColon:
		switch {
		case isSpace(c):
		case c == ':':
			e.member = e.memberOf()
			e.st = envValue
		default:
			e.bad = true
		}
	case envValue:
		if isSpace(c) {
			return
		}
		e.valStart, e.st, e.scalar = pos, envInValue, false
		if e.member == memberID {
			e.keepID(c)
		}
		switch c {
		case '"':
			e.inStr = true
		case '{', '[':
			e.depth = 1
		case ',', '}', ']', ':':
			e.bad = true
		default:
			e.scalar = true
		}
	case envInValue:
		switch c {
		case '"':
			e.inStr = true
		case '{', '[':
			e.depth++
		case '}', ']':
			if e.depth == 0 {
				e.bad = true
				return
			}
			if e.depth--; e.depth == 0 {
				e.endValue(pos + 1)
			}
		}
	case envNext:
		switch {
		case isSpace(c):
		case c == ',':
			e.st = envKey
		case c == '}':
			e.closed, e.st = true, envEnd
		default:
			e.bad = true
		}
	}
}

// memberOf names the member whose name was just read.
func (e *envelope) memberOf() member {
	if e.keyLen > len(e.key) {
		return memberOther
	}
	switch string(e.key[:e.keyLen]) {
	case "id":
		e.hasID, e.idDone, e.id, e.idTooLong = true, false, e.id[:0], false
		return memberID
	case "method":
		e.hasMethod = true
		return memberMethod
	case "result":
		e.hasResult = true
		return memberResult
	case "error":
		e.hasError = true
		return memberError
	}
	return memberOther
}

// endValue ends the member value being read at offset end (exclusive).
func (e *envelope) endValue(end int) {
	switch e.member {
	case memberResult:
		e.resultStart, e.resultEnd = e.valStart, end
	case memberID:
		e.idDone = true
	}
	e.st, e.scalar, e.member = envNext, false, memberOther
}

func (e *envelope) keepID(c byte) {
	if len(e.id) < maxEnvelopeID+1 {
		e.id = append(e.id, c)
	} else {
		e.idTooLong = true
	}
}

// answer reports whether the message, fed whole, is an answer (a result or an error, no
// method) that names the request it answers.
func (e *envelope) answer() bool {
	return e.closed && !e.bad && e.idDone && !e.idTooLong && len(e.id) > 0 && !e.hasMethod && (e.hasResult || e.hasError)
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }
