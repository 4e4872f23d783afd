package main

import (
	"fmt"
	"slices"

	"github.com/batonlm/baton/internal/server"
)

// cors reads the CORS flags; an empty list allows nothing of its kind.
func (f *serveFlags) cors() (*server.CORS, error) {
	c := &server.CORS{Credentials: f.allowCredentials}
	for _, l := range []struct {
		name, val string
		dst       *[]string
	}{
		{"allowed-origins", f.allowedOrigins, &c.Origins},
		{"allowed-methods", f.allowedMethods, &c.Methods},
		{"allowed-headers", f.allowedHeaders, &c.Headers},
	} {
		v, err := server.ParseCORSList(l.val)
		if err != nil {
			return nil, fmt.Errorf("--%s %q: %v", l.name, l.val, err)
		}
		*l.dst = v
	}
	if c.Credentials && slices.Contains(c.Origins, "*") {
		// Answers would name whatever origin asked, with credentials:
		// every web page a user opens could call the API as that user.
		return nil, fmt.Errorf("--allow-credentials with --allowed-origins %q lets any web page call the API with its visitors' credentials; name the origins allowed", f.allowedOrigins)
	}
	return c, nil
}

// mustCORS is cors for flags validate has checked.
func (f *serveFlags) mustCORS() *server.CORS {
	c, err := f.cors()
	if err != nil {
		panic(err)
	}
	return c
}
