package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/batonlm/baton/api/openai"
)

// CORS lets browser apps on other origins call the API, with vLLM's
// settings (--allowed-origins, --allowed-methods, --allowed-headers,
// --allow-credentials) and its behaviour (Starlette's CORSMiddleware): a
// preflight is answered before routing and authentication, since a
// browser sends it without the API key, and every other answer to an
// allowed origin names that origin.
type CORS struct {
	Origins, Methods, Headers []string
	Credentials               bool
}

// DefaultCORS is vLLM's and SGLang's default: every origin, method and
// header, without credentials.
func DefaultCORS() *CORS {
	return &CORS{Origins: []string{"*"}, Methods: []string{"*"}, Headers: []string{"*"}}
}

// ParseCORSList reads a CORS flag's value as vLLM takes it, a JSON list
// (["https://a.example", "https://b.example"]), or as a comma-separated
// list.
func ParseCORSList(s string) ([]string, error) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "[") {
		var out []string
		if err := json.Unmarshal([]byte(s), &out); err != nil {
			return nil, fmt.Errorf("not a JSON list of strings: %v", err)
		}
		return out, nil
	}
	var out []string
	for v := range strings.SplitSeq(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out, nil
}

// corsMethods are the methods a preflight is told of when any is allowed,
// as Starlette lists them.
const corsMethods = "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT"

// corsMaxAge lets a browser reuse a preflight's answer for ten minutes
// (Starlette's default).
const corsMaxAge = "600"

func (c *CORS) any(list []string) bool { return slices.Contains(list, "*") }

func (c *CORS) originAllowed(origin string) bool {
	return c.any(c.Origins) || slices.Contains(c.Origins, origin)
}

// allowOrigin sets the origin headers of an answer to origin. A wildcard
// with credentials must name the origin: browsers refuse "*" then.
func (c *CORS) allowOrigin(h http.Header, origin string) {
	if c.any(c.Origins) && !c.Credentials {
		h.Set("Access-Control-Allow-Origin", "*")
	} else {
		h.Set("Access-Control-Allow-Origin", origin)
		h.Add("Vary", "Origin")
	}
	if c.Credentials {
		h.Set("Access-Control-Allow-Credentials", "true")
	}
}

// handle sets the CORS headers of r's answer; it reports whether it
// answered r itself (a preflight).
func (c *CORS) handle(w http.ResponseWriter, r *http.Request) bool {
	origin := r.Header.Get("Origin")
	h := w.Header()
	if r.Method != http.MethodOptions || origin == "" || r.Header.Get("Access-Control-Request-Method") == "" {
		switch {
		case origin != "" && c.originAllowed(origin):
			c.allowOrigin(h, origin)
		case origin == "" && c.any(c.Origins) && !c.Credentials:
			h.Set("Access-Control-Allow-Origin", "*")
		}
		return false
	}
	want := r.Header.Get("Access-Control-Request-Method")
	var why []string
	if !c.originAllowed(origin) {
		why = append(why, "origin")
	}
	if !c.any(c.Methods) && !slices.ContainsFunc(c.Methods, func(m string) bool { return strings.EqualFold(m, want) }) {
		why = append(why, "method")
	}
	asked := r.Header.Get("Access-Control-Request-Headers")
	if !c.any(c.Headers) {
		for hd := range strings.SplitSeq(asked, ",") {
			hd = strings.TrimSpace(hd)
			if hd != "" && !slices.ContainsFunc(c.Headers, func(a string) bool { return strings.EqualFold(a, hd) }) {
				why = append(why, "headers")
				break
			}
		}
	}
	if c.originAllowed(origin) {
		c.allowOrigin(h, origin)
	}
	if len(why) > 0 {
		openai.WriteError(w, openai.BadRequest("CORS preflight refused: disallowed "+strings.Join(why, ", "), ""))
		return true
	}
	methods := corsMethods
	if !c.any(c.Methods) {
		methods = strings.Join(c.Methods, ", ")
	}
	h.Set("Access-Control-Allow-Methods", methods)
	switch {
	case !c.any(c.Headers):
		h.Set("Access-Control-Allow-Headers", strings.Join(c.Headers, ", "))
	case asked != "":
		h.Set("Access-Control-Allow-Headers", asked)
	}
	h.Set("Access-Control-Max-Age", corsMaxAge)
	w.WriteHeader(http.StatusNoContent)
	return true
}
