package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/batonlm/baton/test/harness"
)

// A router that serves another model name, or tokenizes with another
// tokenizer, than its workers does not pair with them: both workers are
// unhealthy with a reason naming both sides, requests get 503, and a router
// that agrees with the workers serves them.
func TestRouterPairsOnlyWorkersOfItsModel(t *testing.T) {
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1, NoRouter: true})
	workers := []string{"--prefill", c.Prefill[0].URL, "--decode", c.Decode[0].URL}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"served name", []string{"--served-model-name", "other"}, `serves model "stories260K", the router serves "other"`},
		{"tokenizer", []string{"--tokenizer", storiesHFDir(t)}, "tokenizes with another tokenizer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := harness.StartWith(t, harness.Options{Unready: true}, append(append([]string{"--role", "router"}, tc.args...), workers...)...)
			var info struct {
				Workers []struct {
					Role, Error string
					Healthy     bool
				} `json:"workers"`
			}
			ok := false
			for range 100 {
				code, b := harness.Get(t, r.URL+"/server_info")
				if code == 200 && json.Unmarshal(b, &info) == nil && len(info.Workers) == 2 && info.Workers[0].Error != "" && info.Workers[1].Error != "" {
					ok = true
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if !ok {
				t.Fatalf("workers never refused: %+v", info)
			}
			for _, w := range info.Workers {
				if w.Healthy || !strings.Contains(w.Error, tc.want) {
					t.Errorf("%s worker: healthy %v, %q; want the reason %q", w.Role, w.Healthy, w.Error, tc.want)
				}
			}
			if code, _, b := post(t, r.URL+"/v1/completions", `{"model":"other","prompt":"Once","max_tokens":4}`); code != 503 && code != 404 {
				t.Errorf("a request through the mismatched router: %d %s", code, b)
			}
		})
	}
	// The same workers behind a router that agrees serve the reference.
	r := harness.Start(t, append([]string{"--role", "router"}, workers...)...)
	if got := ask(t, r.URL, "/v1/completions", `{"model":"stories260K","prompt":"Once upon a time","max_tokens":8,"temperature":0}`).texts(); len(got) != 1 || got[0] == "" {
		t.Fatalf("the agreeing router: %v", got)
	}
}

// A router given no --model learns the model from a prefill worker: the
// tokenizer's files (a GGUF's metadata, or a Hugging Face directory's
// tokenizer files) with their hash, checked against the fingerprint the
// worker reports, and the name it serves; /server_info shows both sides'
// identity, and it answers as the workers' own model does.
func TestRouterLearnsTheWorkersModel(t *testing.T) {
	ref := loadReference(t)
	for _, tc := range []struct {
		name   string
		worker []string
		served string
	}{
		{"gguf", []string{"--served-model-name", "other"}, "other"},
		{"hf", []string{"--model", storiesHFDir(t), "--served-model-name", "stories-hf"}, "stories-hf"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1, NoRouter: true, WorkerArgs: tc.worker})
			r := harness.Start(t, "--role", "router", "--prefill", c.Prefill[0].URL, "--decode", c.Decode[0].URL)
			var info struct {
				Model     string `json:"model"`
				Tokenizer string `json:"tokenizer_fingerprint"`
				Workers   []struct {
					Healthy     bool
					ServedModel string `json:"served_model"`
					Tokenizer   string `json:"tokenizer_fingerprint"`
				} `json:"workers"`
			}
			code, b := harness.Get(t, r.URL+"/server_info")
			if code != 200 || json.Unmarshal(b, &info) != nil || info.Model != tc.served || info.Tokenizer == "" || len(info.Workers) != 2 {
				t.Fatalf("/server_info: %d %s", code, b)
			}
			for _, w := range info.Workers {
				if !w.Healthy || w.ServedModel != tc.served || w.Tokenizer != info.Tokenizer {
					t.Errorf("worker %+v; the router serves %q with tokenizer %s", w, info.Model, info.Tokenizer)
				}
			}
			body := strings.Replace(greedyBody(ref), `"stories260K"`, `"`+tc.served+`"`, 1)
			code, _, out := post(t, r.URL+"/v1/completions", body)
			var cr struct {
				Choices []struct{ Text string } `json:"choices"`
			}
			if code != 200 || json.Unmarshal(out, &cr) != nil || len(cr.Choices) != 1 || cr.Choices[0].Text != ref.GeneratedText {
				t.Fatalf("through the router that learned the model: %d %s, want %q", code, out, ref.GeneratedText)
			}
		})
	}
}
