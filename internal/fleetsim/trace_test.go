package fleetsim

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseTrace(t *testing.T) {
	got, err := ParseTrace(strings.NewReader("arrival_s,prompt_tokens,output_tokens\n# a comment\n\n1.5,100,20\n0.25, 7 ,1\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []Request{{Arrival: 250 * time.Millisecond, Prompt: 7, Output: 1}, {Arrival: 1500 * time.Millisecond, Prompt: 100, Output: 20}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for _, bad := range []string{"1,2\n", "x,1,1\n", "1,0,1\n", "-1,1,1\n", "NaN,1,1\n", "1,1,99999999999\n", "1,1,1,1\n"} {
		if _, err := ParseTrace(strings.NewReader(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// A generated trace written out reads back the same, to the microsecond.
func TestTraceRoundTrip(t *testing.T) {
	reqs, err := Generate(Gen{Shape: Burst, Duration: time.Minute, Rate: 5, PromptMean: 100, OutputMean: 50, CV: 1, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := WriteTrace(&b, reqs); err != nil {
		t.Fatal(err)
	}
	back, err := ParseTrace(&b)
	if err != nil {
		t.Fatal(err)
	}
	if len(back) != len(reqs) {
		t.Fatalf("%d requests back of %d", len(back), len(reqs))
	}
	for i := range reqs {
		if d := back[i].Arrival - reqs[i].Arrival; d > time.Microsecond || d < -time.Microsecond || back[i].Prompt != reqs[i].Prompt || back[i].Output != reqs[i].Output {
			t.Fatalf("request %d: %+v back as %+v", i, reqs[i], back[i])
		}
	}
}

// A trace file is whatever a user hands in: the parser never panics, and
// what it accepts is sorted, in range and writes back to itself.
func FuzzParseTrace(f *testing.F) {
	for _, s := range []string{"arrival_s,prompt_tokens,output_tokens\n0,1,1\n", "1.5,100,20\n0.25,7,1\n", "# x\n\n3,4,5", "1e3,2,2\n", "0x10,1,1\n", "1,+1,1\n", ",,\n", "Arrival\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		reqs, err := ParseTrace(bytes.NewReader(data))
		if err != nil {
			return
		}
		for i, r := range reqs {
			if r.Arrival < 0 || r.Prompt < 1 || r.Output < 1 || r.Prompt > maxTraceTokens || r.Output > maxTraceTokens {
				t.Fatalf("request %d out of range: %+v", i, r)
			}
			if i > 0 && r.Arrival < reqs[i-1].Arrival {
				t.Fatalf("request %d out of order", i)
			}
		}
		var b bytes.Buffer
		if err := WriteTrace(&b, reqs); err != nil {
			t.Fatal(err)
		}
		back, err := ParseTrace(&b)
		if err != nil || len(back) != len(reqs) {
			t.Fatalf("written trace does not read back: %v (%d of %d)", err, len(back), len(reqs))
		}
	})
}
