// Package httpauth checks the API key that baton's HTTP surfaces (router,
// standalone server and workers) require when started with --api-key.
package httpauth

import (
	"crypto/subtle"
	"net/http"
	"strings"

	"github.com/batonlm/baton/api/openai"
)

// Bearer returns the credentials of an Authorization header value that uses
// the Bearer scheme. The scheme word is case-insensitive (RFC 9110 §11.1),
// so clients that send "bearer" are not turned away; anything that is not
// exactly a scheme, spaces and one non-empty token is refused rather than
// guessed at.
func Bearer(header string) (string, bool) {
	const scheme = "bearer"
	if len(header) <= len(scheme) || !strings.EqualFold(header[:len(scheme)], scheme) || header[len(scheme)] != ' ' {
		return "", false
	}
	cred := strings.TrimLeft(header[len(scheme):], " ")
	if cred == "" || strings.ContainsAny(cred, " \t\r\n") {
		return "", false
	}
	return cred, true
}

// Valid reports whether r carries key. A request with several
// Authorization headers is refused: which one a proxy or a library reads
// first differs, and a key must not be smuggled in behind another.
func Valid(r *http.Request, key string) bool {
	vals := r.Header.Values("Authorization")
	if len(vals) != 1 {
		return false
	}
	got, ok := Bearer(vals[0])
	// ConstantTimeCompare still returns at once on a length mismatch; the
	// key's length is not the secret.
	return ok && subtle.ConstantTimeCompare([]byte(got), []byte(key)) == 1
}

// Require wraps h so that it answers 401 in OpenAI's error shape unless
// the request carries key; an empty key lets every request through. The
// refusal comes before the handler reads anything of the body, and the
// connection closes after it, so a client that keeps a body coming (or
// never ends it) cannot hold the server reading.
func Require(key string, h http.Handler) http.Handler {
	if key == "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !Valid(r, key) {
			Refuse(w)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Refuse answers a request without a valid key.
func Refuse(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="baton"`)
	// Without it net/http would try to drain the unread body before
	// answering, and a body that never ends would hold the 401 back.
	w.Header().Set("Connection", "close")
	openai.WriteError(w, openai.Unauthorized("invalid or missing API key"))
}
