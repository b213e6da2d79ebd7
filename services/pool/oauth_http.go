package pool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// OAuthCallbackPath is where authorization servers send users back (oauth.callback_url names
// it as the user's browser reaches the HTTP listener).
const OAuthCallbackPath = "/v1/oauth/callback"

// callbackTimeout bounds one callback: the token exchange and connecting the server.
const callbackTimeout = 60 * time.Second

// OAuthCallbackHandler serves /v1/oauth/callback: the browser redirect that ends a sign-in. It
// takes no API key: it is authenticated by the state it carries, which is good once, bound to
// the tenant, user and server the sign-in began for, and expires (oauth.state_ttl). The page
// it answers names the server and whether it is connected, never the code, the state or a
// token.
func (s *Service) OAuthCallbackHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "text/plain; charset=utf-8")
		h.Set("Cache-Control", "no-store")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Content-Security-Policy", "default-src 'none'")
		if r.Method != http.MethodGet {
			h.Set("Allow", http.MethodGet)
			http.Error(w, "the sign-in callback takes GET only", http.StatusMethodNotAllowed)
			return
		}
		if err := s.signInConfigured(); err != nil {
			http.Error(w, "sign-in is not configured on this server", http.StatusNotFound)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), callbackTimeout)
		defer cancel()
		done, err := s.CompleteSignIn(ctx, r.URL.Query())
		if err != nil {
			status := http.StatusBadRequest
			if !errors.Is(err, errBadCallback) {
				status = http.StatusBadGateway
			}
			s.log.Warn("a sign-in callback was refused", "err", err)
			http.Error(w, "Sign-in failed: "+strings.TrimPrefix(err.Error(), "pool: "), status)
			return
		}
		msg := fmt.Sprintf("Signed in to %s as %s. ", done.Ref, done.User)
		if done.ConnectErr != nil {
			s.log.Warn("a server could not be connected after its sign-in", "server", done.Ref, "err", done.ConnectErr)
			msg += "The server could not be connected yet: connecting it again finishes (ringfence servers connect " + done.Ref + ").\n"
		} else {
			msg += fmt.Sprintf("The server is connected (%d tools). You can close this window.\n", len(done.Tools))
		}
		_, _ = w.Write([]byte(msg))
	})
}

// ClientMetadataHandler serves the pool's client ID metadata document
// (draft-ietf-oauth-client-id-metadata-document) at OAuthClientMetadataPath, for
// authorization servers that take a URL as client id: no API key, as they fetch it
// themselves. It names Ringfence as a public client whose one redirect URI is the callback.
func (s *Service) ClientMetadataHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "the client metadata document takes GET only", http.StatusMethodNotAllowed)
			return
		}
		if err := s.signInConfigured(); err != nil {
			http.Error(w, "sign-in is not configured on this server", http.StatusNotFound)
			return
		}
		body, err := json.Marshal(s.ClientMetadata())
		if err != nil {
			http.Error(w, "the client metadata document could not be made", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "public, max-age=300")
		_, _ = w.Write(body)
	})
}
