package main

import (
	"fmt"

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
