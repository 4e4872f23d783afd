package ucx

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
)

func goodWelcome() welcome {
	return welcome{WorkerAddr: []byte{1, 2, 3}, RKey: []byte{4, 5}, Base: 1 << 40, Length: 4 * 4096,
		PageSize: 16, Layers: 2, KVHeads: 2, HeadDim: 8, Host: "boot/host", Pages: []int32{3, 0, 2}}
}

func TestControlRoundTrip(t *testing.T) {
	h := hello{Room: 7, Epoch: 1 << 50, PID: 42, Host: "b/h"}
	typ, p, err := readMsg(bytes.NewReader(h.marshal()))
	if err != nil || typ != msgHello {
		t.Fatalf("readMsg(HELLO): %d %v", typ, err)
	}
	if got, err := parseHello(p); err != nil || got != h {
		t.Errorf("HELLO round trip: %+v %v, want %+v", got, err, h)
	}
	for _, sum := range []uint32{sumXXH3, sumPageSum} {
		w := goodWelcome()
		w.Sum = sum
		typ, p, err = readMsg(bytes.NewReader(w.marshal()))
		if err != nil || typ != msgWelcome {
			t.Fatalf("readMsg(WELCOME): %d %v", typ, err)
		}
		if got, err := parseWelcome(p); err != nil || !reflect.DeepEqual(got, w) {
			t.Errorf("WELCOME round trip: %+v %v, want %+v", got, err, w)
		}
	}
	typ, p, err = readMsg(bytes.NewReader(refuseMsg(strings.Repeat("x", 10000))))
	if err != nil || typ != msgRefuse || len(p) != maxText {
		t.Errorf("REFUSE: type %d, %d bytes, %v; want the text cut to %d", typ, len(p), err, maxText)
	}
	for _, typ := range []byte{msgEnd, msgClosing} {
		if got, p, err := readMsg(bytes.NewReader(frame(typ, nil))); err != nil || got != typ || p != nil {
			t.Errorf("type %d: %d %v %v", typ, got, p, err)
		}
	}
	if _, _, err := readMsg(bytes.NewReader(nil)); err != io.EOF {
		t.Errorf("empty stream: %v, want io.EOF", err)
	}
}

// TestWelcomeChecks: a sender computes remote addresses from a WELCOME, so
// one that would send a put outside the registered memory is refused.
func TestWelcomeChecks(t *testing.T) {
	cases := map[string]func(w *welcome){
		"PageOutside":   func(w *welcome) { w.Pages = []int32{4} },
		"NegativePage":  func(w *welcome) { w.Pages = []int32{-1} },
		"ShortRegion":   func(w *welcome) { w.Length = 4095 },
		"ZeroLayout":    func(w *welcome) { w.HeadDim = 0 },
		"HugeLayout":    func(w *welcome) { w.PageSize, w.Layers, w.KVHeads, w.HeadDim = 1<<31, 1<<31, 1<<31, 1<<31 },
		"Wraps":         func(w *welcome) { w.Base = ^uint64(0) - 100 },
		"NoKey":         func(w *welcome) { w.RKey = nil },
		"NoWorkerAddr":  func(w *welcome) { w.WorkerAddr = nil },
		"Q8_0DType":     func(w *welcome) { w.DType = uint32(kernels.Q8_0) },
		"UnknownDType":  func(w *welcome) { w.DType = 1 << 20 },
		"F16Outside":    func(w *welcome) { w.DType, w.Pages = uint32(kernels.F16), []int32{8} },
		"UnknownSum":    func(w *welcome) { w.Sum = 2 },
		"TrailingBytes": nil,
	}
	for name, mut := range cases {
		t.Run(name, func(t *testing.T) {
			w := goodWelcome()
			msg := w.marshal()
			if mut != nil {
				mut(&w)
				msg = w.marshal()
			} else {
				msg = append(msg, 0)
				msg[4]++ // the length covers the extra byte
			}
			_, p, err := readMsg(bytes.NewReader(msg))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := parseWelcome(p); !errors.Is(err, errMalformed) {
				t.Errorf("parseWelcome: %v, want errMalformed", err)
			}
		})
	}
}

func TestReadMsgLimits(t *testing.T) {
	cases := map[string][]byte{
		"BadMagic":     {0xBD, 1, msgEnd, 0, 0, 0, 0, 0},
		"BadVersion":   {0xBC, ctlVersion + 1, msgEnd, 0, 0, 0, 0, 0},
		"Flags":        {0xBC, ctlVersion, msgEnd, 1, 0, 0, 0, 0},
		"UnknownType":  {0xBC, ctlVersion, 99, 0, 0, 0, 0, 0},
		"EndWithBytes": {0xBC, ctlVersion, msgEnd, 0, 1, 0, 0, 0, 7},
		"HugeHello":    {0xBC, ctlVersion, msgHello, 0, 0, 0, 1, 0},
		"HugeWelcome":  {0xBC, ctlVersion, msgWelcome, 0, 0xff, 0xff, 0xff, 0xff},
		"CutPayload":   {0xBC, ctlVersion, msgRefuse, 0, 10, 0, 0, 0, 'a'},
		"CutHeader":    {0xBC, ctlVersion},
		"HelloEmpty":   append(hello{Host: "x"}.marshal()[:4], 0, 0, 0, 0),
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			typ, p, err := readMsg(bytes.NewReader(in))
			if err == nil {
				if typ == msgHello {
					_, err = parseHello(p)
				}
			}
			if err == nil {
				t.Errorf("accepted: type %d, %d bytes", typ, len(p))
			}
		})
	}
}

// FuzzControl: no input makes the decoders panic or accept a WELCOME that
// fails its own checks.
func FuzzControl(f *testing.F) {
	f.Add(hello{Room: 1, Epoch: 2, PID: 3, Host: "h"}.marshal())
	f.Add(goodWelcome().marshal())
	pageSum := goodWelcome()
	pageSum.Sum = sumPageSum
	f.Add(pageSum.marshal())
	f.Add(refuseMsg("no"))
	f.Add(frame(msgEnd, nil))
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		for {
			typ, p, err := readMsg(r)
			if err != nil {
				return
			}
			switch typ {
			case msgHello:
				_, _ = parseHello(p)
			case msgWelcome:
				if w, err := parseWelcome(p); err == nil {
					if err := w.check(); err != nil {
						t.Fatalf("parseWelcome accepted a welcome its check refuses: %v", err)
					}
				}
			}
		}
	})
}
