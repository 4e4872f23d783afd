package router

import (
	"net/http"
	"regexp"
	"strings"
)

// What a client is told when a request fails between the workers. The
// workers' own texts name internal addresses, rooms, epochs, pages and
// writers, which mean nothing to a client and map the cluster for an
// attacker; they go to the log under the request id instead.
const (
	msgHandoff     = "the KV handoff between the prefill and decode workers failed; retry the request"
	msgNoPair      = "no healthy prefill/decode pair is available; retry later"
	msgDecodeFull  = "no decode worker has free KV cache for this request now; retry later"
	msgPrefillFull = "every prefill worker's queue is full; retry later"
	msgTimeout     = "the workers did not answer in time; retry the request"
	msgMisconfig   = "the prefill and decode workers are not configured alike; the operator's logs say how"
	msgInterrupted = "generation was interrupted: the decode worker stopped answering"
	msgDecodeFail  = "generation failed on the decode worker"
	// msgMigrations takes the number of decode workers that failed the
	// request (one more than the migrations it made).
	msgMigrations = "generation was interrupted: %d decode workers in a row failed while generating it, the most the router tries; retry the request"
	msgAnomaly    = "generation stopped: speculative decoding on the decode worker found its KV cache suspect (spec_anomaly), and no other decode worker could take the request over; retry it"
)

// internalWords mark a worker's text as one about the cluster, not about
// the request the client sent: room, epoch and page numbers, and the
// handoff's vocabulary. ("No room to generate" is the door's, and fine.)
var internalWords = regexp.MustCompile(`(?i)\b(rooms?|epochs?|pages?)\b\W{0,2}\d|\b(writers?|reservations?|commit(ted|s)?|transport|checksums?|grpc|dial(ing)?|rpc|drain(ed)?|quarantined?)\b`)

// addressLike matches host:port pairs, IPv4 and bracketed IPv6 addresses,
// and URLs.
var addressLike = regexp.MustCompile(`\d{1,3}(\.\d{1,3}){3}|\[[0-9a-fA-F:]*\]|[A-Za-z0-9.-]+:\d{2,5}\b|://`)

// clientText reports whether a worker's refusal may be shown to the client
// as it is: the door checks (prompt too long, token outside the
// vocabulary) speak about the request, and nothing else may through.
func clientText(msg string) bool {
	return msg != "" && !internalWords.MatchString(msg) && !addressLike.MatchString(msg) && !strings.ContainsAny(msg, "\"`")
}

// handoffError is what the client sees of a failed handoff.
func handoffError(status int) *Error {
	switch status {
	case http.StatusServiceUnavailable:
		return &Error{Status: status, Message: msgHandoff}
	case http.StatusGatewayTimeout:
		return &Error{Status: status, Message: msgTimeout}
	}
	return &Error{Status: http.StatusBadGateway, Message: msgHandoff}
}
