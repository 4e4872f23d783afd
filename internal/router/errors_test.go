package router

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/request"
)

// leakInMessage matches what a client must never read: addresses and ports, and the
// handoff's internals.
var leakInMessage = regexp.MustCompile(`(?i)127\.0\.0\.1|10\.\d+\.\d+\.\d+|:\d{2,5}\b|\broom|\bepoch|\bwriter|\bpages?\b|grpc|rpc error|desc =`)

const doorText = "this model's maximum context length is 512 tokens; the prompt has 600 tokens, leaving no room to generate"

// The workers' texts, as they phrase their failures, reach the log under
// the request id and never the client.
func TestClientErrorsLeakNothing(t *testing.T) {
	const addr = `"127.0.0.1:40113"`
	for _, tc := range []struct {
		name   string
		setup  func(c *cluster)
		status int
		msg    string // the client's message, exactly
		detail string // in the log
	}{
		{"decode unreachable at reserve", func(c *cluster) {
			c.decode[0].reserveErr = func() error {
				return status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:8201: connect: connection refused"`)
			}
		}, 503, msgNoPair, "dial tcp 127.0.0.1:8201"},
		{"decode full", func(c *cluster) {
			c.decode[0].reserveErr = func() error {
				return status.Error(codes.ResourceExhausted, "no room for 40 tokens in the KV pool now; retry later")
			}
		}, 429, msgDecodeFull, "no room for 40 tokens"},
		{"prefill queue full", func(c *cluster) {
			c.prefill[0].prefillFn = func(context.Context, *pdv1.PrefillRequest) error {
				return status.Error(codes.ResourceExhausted, "server is at capacity; retry later")
			}
		}, 429, msgPrefillFull, "server is at capacity"},
		{"prefill cannot reach decode's transport", func(c *cluster) {
			c.prefill[0].prefillFn = func(context.Context, *pdv1.PrefillRequest) error {
				return status.Error(codes.Unavailable, "cannot reach decode transport 127.0.0.1:40999: dial tcp 127.0.0.1:40999: connection refused")
			}
		}, 503, msgHandoff, "cannot reach decode transport 127.0.0.1:40999"},
		{"commit refused", func(c *cluster) {
			c.prefill[0].prefillFn = func(context.Context, *pdv1.PrefillRequest) error {
				return status.Error(codes.FailedPrecondition, "commit refused by decode: commit from "+addr+" refused: writer is not the reservation's (room 7 epoch 3)")
			}
		}, 502, msgHandoff, "commit refused by decode"},
		{"reservation shorter than the prompt", func(c *cluster) {
			c.prefill[0].prefillFn = func(context.Context, *pdv1.PrefillRequest) error {
				return status.Error(codes.InvalidArgument, "reservation covers 32 tokens in 2 pages; the prompt has 40 tokens")
			}
		}, 502, msgHandoff, "reservation covers 32 tokens"},
		{"page owner check", func(c *cluster) {
			c.prefill[0].prefillFn = func(context.Context, *pdv1.PrefillRequest) error {
				return status.Error(codes.Internal, "page 12 carries owner room 3 epoch 9")
			}
		}, 502, msgHandoff, "page 12 carries owner"},
		{"prefill's call times out", func(c *cluster) {
			c.prefill[0].prefillFn = func(context.Context, *pdv1.PrefillRequest) error {
				return status.Error(codes.DeadlineExceeded, "waiting for 127.0.0.1:40113")
			}
		}, 503, msgTimeout, "waiting for 127.0.0.1:40113"}, // before any token: retry later
		{"token stream refused", func(c *cluster) {
			c.decode[0].streamFn = func(*fakeRoom, grpc.ServerStreamingServer[pdv1.TokenEvent]) error {
				return status.Error(codes.NotFound, "no reservation room 5 epoch 2")
			}
		}, 502, msgHandoff, "no reservation room 5 epoch 2"},
		{"decode aborts a failed commit", func(c *cluster) {
			c.decode[0].streamFn = func(_ *fakeRoom, srv grpc.ServerStreamingServer[pdv1.TokenEvent]) error {
				return srv.Send(&pdv1.TokenEvent{Error: "request aborted: commit from " + addr + " refused by the checksum check: page 4", Code: 499})
			}
		}, 502, msgHandoff, "refused by the checksum check"},
		{"decode fails after the first token", func(c *cluster) {
			c.decode[0].streamFn = func(rm *fakeRoom, srv grpc.ServerStreamingServer[pdv1.TokenEvent]) error {
				<-rm.committed
				if err := srv.Send(&pdv1.TokenEvent{Token: &pdv1.Token{Id: 42}}); err != nil {
					return err
				}
				return srv.Send(&pdv1.TokenEvent{Error: "read gate: page 9 not written (room 4 epoch 1)", Code: 500})
			}
		}, 502, msgDecodeFail, "read gate: page 9"},
		{"stream breaks after the first token", func(c *cluster) {
			c.decode[0].streamFn = func(rm *fakeRoom, srv grpc.ServerStreamingServer[pdv1.TokenEvent]) error {
				<-rm.committed
				if err := srv.Send(&pdv1.TokenEvent{Token: &pdv1.Token{Id: 42}}); err != nil {
					return err
				}
				return status.Error(codes.Unavailable, "decode at 127.0.0.1:40113 went away")
			}
		}, 502, msgInterrupted, "decode at 127.0.0.1:40113 went away"},
		{"a door refusal passes as written", func(c *cluster) {
			c.decode[0].reserveErr = func() error {
				return status.Error(codes.InvalidArgument, doorText)
			}
		}, 400, doorText, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// No queue: a full decode worker answers at once.
			c := newCluster(t, 1, 1, func(o *Options) { o.Retries, o.MaxQueued = -1, -1 })
			c.refresh()
			tc.setup(c)
			id := "req-" + strings.ReplaceAll(tc.name, " ", "-")
			var status int
			var msg string
			st, err := c.generate(id, 4, request.Params{})
			if err != nil {
				var rej *request.RejectError
				var e *Error
				switch {
				case errors.As(err, &rej):
					status, msg = rej.Status, rej.Message
				case errors.As(err, &e):
					status, msg = e.Status, e.Message
				default:
					t.Fatalf("refusal %T %v", err, err)
				}
			} else {
				_, last := readAll(t, st)
				var e *Error
				if !errors.As(last.Err, &e) {
					t.Fatalf("last event %+v", last)
				}
				status, msg = e.Status, e.Message
			}
			if status != tc.status {
				t.Errorf("status %d, want %d (%s)", status, tc.status, msg)
			}
			if msg != tc.msg {
				t.Errorf("message %q, want %q", msg, tc.msg)
			}
			if tc.detail == "" {
				return // the door's text speaks of the request ("no room to generate" is no room id)
			}
			if leakInMessage.MatchString(msg) {
				t.Errorf("the client's message %q leaks %q", msg, leakInMessage.FindString(msg))
			}
			// The worker's words are in the log line of the request.
			found := false
			for _, line := range strings.Split(c.logs.String(), "\n") {
				if strings.Contains(line, "request_id="+id) && strings.Contains(line, tc.detail) {
					found = true
				}
			}
			if !found {
				t.Errorf("no log line with request_id=%s and %q:\n%s", id, tc.detail, c.logs.String())
			}
		})
	}
}

func TestNoPairMessageNamesNoWorker(t *testing.T) {
	c := newCluster(t, 1, 1, nil)
	c.decode[0].setInfo(func(i *pdv1.WorkerInfo) { i.Layout.PageSize = 32 })
	c.refresh()
	_, err := c.generate("mismatch", 4, request.Params{})
	var rej *request.RejectError
	if !errors.As(err, &rej) || rej.Status != 503 || rej.RetryAfter < 1 {
		t.Fatalf("got %v", err)
	}
	if leakInMessage.MatchString(rej.Message) || strings.Contains(rej.Message, "http") {
		t.Fatalf("message %q names a worker", rej.Message)
	}
}

func TestClientText(t *testing.T) {
	for msg, ok := range map[string]bool{
		"token id 9999 is outside the vocabulary (0..511)":                            true,
		"this model's maximum context length is 512 tokens; you requested 600 tokens": true,
		"prompt exceeds the pool":                                                     true,
		"reservation covers 32 tokens in 2 pages; the prompt has 40 tokens":           false,
		"commit from \"127.0.0.1:1\" refused":                                         false,
		"cannot reach 10.0.0.7":                                                       false,
		"worker-3.decode.svc:9000 refused":                                            false,
		"dial [::1]:80":                                                               false,
		"writer mismatch":                                                             false,
		"room 3":                                                                      false,
		"http://decode-0":                                                             false,
		"":                                                                            false,
	} {
		if got := clientText(msg); got != ok {
			t.Errorf("clientText(%q) = %v, want %v", msg, got, ok)
		}
	}
}
