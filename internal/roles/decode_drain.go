package roles

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"sync"

	"github.com/batonlm/baton/api/openai"
	"github.com/batonlm/baton/internal/httpauth"
)

// errHandBack is the cause that ends a stream's wait for its next event
// when the worker hands its requests back.
var errHandBack = errors.New("decode worker draining: the request is handed back to the router")

// liveStreams are the Stream calls a decode worker serves, so that a drain
// can end each with a hand-back (HandBack).
type liveStreams struct {
	mu   sync.Mutex
	set  map[*context.CancelCauseFunc]struct{}
	back bool // HandBack ran: a stream opened from now on is handed back at once
}

// watch registers one Stream call; the context it returns ends with
// errHandBack when the worker hands its requests back (or with ctx).
// Call stop when the call returns.
func (d *Decode) watch(ctx context.Context) (hctx context.Context, stop func()) {
	hctx, cancel := context.WithCancelCause(ctx)
	l := &d.live
	l.mu.Lock()
	if l.back {
		cancel(errHandBack)
	} else {
		if l.set == nil {
			l.set = map[*context.CancelCauseFunc]struct{}{}
		}
		l.set[&cancel] = struct{}{}
	}
	l.mu.Unlock()
	return hctx, func() {
		l.mu.Lock()
		delete(l.set, &cancel)
		l.mu.Unlock()
		cancel(nil)
	}
}

// HandBack ends every request this worker streams to a router, and any
// stream opened later, with a hand-back: each is aborted through the
// desk (one in the batch by its engine, Engine.Abort; one still waiting for
// its Commit by the desk, its pages waiting for the writer's drain as
// after any abort), the tokens it generated before the abort still go out,
// and its last event is finish "drain" with code 503, on which the router
// goes on on another pair from the tokens the client has. A request that
// ended before the abort took ends as it would have. It returns how many
// streams it told. A draining worker calls it once its --drain-grace is
// over, so that it exits within seconds instead of waiting for its longest
// generation; call SetShuttingDown first, or new work keeps coming.
func (d *Decode) HandBack() int {
	l := &d.live
	l.mu.Lock()
	defer l.mu.Unlock()
	l.back = true
	n := len(l.set)
	for c := range l.set {
		(*c)(errHandBack)
	}
	clear(l.set)
	return n
}

// drainHandler serves POST /drain: the worker stops taking work as on
// SIGTERM (a decode worker hands its running requests back once its drain
// grace is over) but keeps running, answering /health with 503, until it
// is stopped. It ends the worker's service, so a stranger gets nothing of
// it: with --api-key, a caller without the key gets the 401 every keyed
// route gives; without one, only a caller on this host that is no web page
// (no Origin header: a browser sends one with any cross-site POST) may
// ask, and to anyone else the route does not exist (the 404 of an unknown
// route). Nothing of the body is read.
func drainHandler(o HTTPOptions) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		switch {
		case o.APIKey != "":
			if !httpauth.Valid(r, o.APIKey) {
				httpauth.Refuse(rw)
				return
			}
		case !fromLoopback(r) || len(r.Header.Values("Origin")) > 0:
			openai.WriteError(rw, openai.NotFound("unknown route "+openai.Cut(r.Method)+" "+openai.Cut(r.URL.Path), "not_found"))
			return
		}
		if r.Method != http.MethodPost {
			rw.Header().Set("Allow", http.MethodPost)
			openai.WriteError(rw, openai.MethodNotAllowed("invalid method for URL ("+openai.Cut(r.Method)+" "+openai.Cut(r.URL.Path)+"); it takes POST"))
			return
		}
		o.Drain()
		rw.Header().Set("Content-Type", "application/json")
		rw.WriteHeader(http.StatusAccepted)
		_, _ = rw.Write([]byte(`{"status":"draining"}`))
	})
}

// fromLoopback says whether r's connection comes from this host.
func fromLoopback(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}
