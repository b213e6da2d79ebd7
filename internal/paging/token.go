package paging

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
)

// ErrBadToken means a page token is not one EncodeToken made for this list: damaged, made
// up, or issued for another list (another tenant's, another graph's). Without the check, a
// token that decoded to a position past the end answered an empty, final page, and a client
// holding a damaged token concluded the list had ended.
var ErrBadToken = errors.New("paging: page token not issued for this list")

const (
	tokenVersion = 1
	tokenSumLen  = 8
	// MaxTokenPosition bounds the position a token carries, in bytes.
	MaxTokenPosition = 256
)

// EncodeToken returns a page token for position (the last key a page held): a version byte,
// the position and a checksum over both and scope, base64url. scope names the list the token
// is for (e.g. "graphs", tenant), so it is refused by any other. The checksum catches damage
// and invention, not forgery: a token grants nothing a caller could not list anyway.
func EncodeToken(position string, scope ...string) string {
	b := make([]byte, 0, 1+len(position)+tokenSumLen)
	b = append(b, tokenVersion)
	b = append(b, position...)
	sum := tokenSum(b, scope)
	return base64.RawURLEncoding.EncodeToString(append(b, sum[:]...))
}

// DecodeToken returns the position of a token EncodeToken made with the same scope, "" for an
// empty token (the first page), or ErrBadToken.
func DecodeToken(token string, scope ...string) (string, error) {
	if token == "" {
		return "", nil
	}
	b, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(b) < 1+1+tokenSumLen || len(b) > 1+MaxTokenPosition+tokenSumLen || b[0] != tokenVersion {
		return "", ErrBadToken
	}
	body, sum := b[:len(b)-tokenSumLen], b[len(b)-tokenSumLen:]
	if want := tokenSum(body, scope); !bytes.Equal(sum, want[:]) {
		return "", ErrBadToken
	}
	return string(body[1:]), nil
}

func tokenSum(body []byte, scope []string) [tokenSumLen]byte {
	h := sha256.New()
	for _, s := range scope {
		// Length-prefixed, so ("ab", "c") and ("a", "bc") differ.
		_ = binary.Write(h, binary.BigEndian, uint32(len(s)))
		h.Write([]byte(s))
	}
	h.Write(body)
	var out [tokenSumLen]byte
	copy(out[:], h.Sum(nil))
	return out
}
