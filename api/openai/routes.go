package openai

import (
	"net/http"
	"strings"
)

// MethodNotAllowed is a 405 for a route that exists under other methods,
// as OpenAI answers GET /v1/completions. The caller sets the Allow header.
func MethodNotAllowed(msg string) *Error {
	return &Error{Status: http.StatusMethodNotAllowed, Message: msg, Type: TypeInvalidRequest, Code: strPtr("method_not_allowed")}
}

// probeMethods are tried against a mux to learn which methods a path takes.
var probeMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions}

// NoRoute answers what none of mux's routes took: 405 with Allow when the
// path is served under other methods, else 404, both in OpenAI's shape.
// It is meant as mux's catch-all "/" handler, which is otherwise also what
// a known path with a wrong method falls through to and so would answer
// 404 where clients look for 405.
func NoRoute(mux *http.ServeMux) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var allow []string
		for _, m := range probeMethods {
			if m == r.Method {
				continue
			}
			probe := r.Clone(r.Context())
			probe.Method = m
			if _, pattern := mux.Handler(probe); pattern != "" && pattern != "/" {
				allow = append(allow, m)
			}
		}
		if len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			WriteError(w, MethodNotAllowed("invalid method for URL ("+Cut(r.Method)+" "+Cut(r.URL.Path)+"); it takes "+strings.Join(allow, ", ")))
			return
		}
		WriteError(w, NotFound("unknown route "+Cut(r.Method)+" "+Cut(r.URL.Path), "not_found"))
	}
}
