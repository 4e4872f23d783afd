package chat

import (
	"encoding/json"
	"os"
	"testing"
)

// TestQwen3Template renders conversations beyond the five recorded in
// testdata/tokenizers/qwen3/chat-template-cases.json (which the tokenizer
// package checks) through the real Qwen3 template: thinking blocks in
// assistant turns, tool responses, several system messages. The expected
// strings are what Python Jinja2 3.1.6 renders with the sandboxed
// environment, trim_blocks and lstrip_blocks, as transformers does.
func TestQwen3Template(t *testing.T) {
	tpl := qwen3Template(t)
	for i, tc := range []struct {
		msgs           []Message
		withGen, plain string
	}{
		{[]Message{{Role: "user", Content: "Hi"}, {Role: "assistant", Content: "<think>\nplan\n</think>\n\nHello!"}, {Role: "user", Content: "Again"}},
			"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n",
			"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nAgain<|im_end|>\n"},
		{[]Message{{Role: "system", Content: "S"}, {Role: "user", Content: "Q"}, {Role: "assistant", Content: "<think>r</think>A"}},
			"<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\nA<|im_end|>\n<|im_start|>assistant\n",
			"<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\nA<|im_end|>\n"},
		{[]Message{{Role: "user", Content: "Q"}, {Role: "assistant", Content: "A1"}, {Role: "user", Content: "<tool_response>x</tool_response>"}, {Role: "assistant", Content: "\n\n<think>\nr2\n</think>\n\nA2"}},
			"<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\n<tool_response>x</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\nr2\n</think>\n\nA2<|im_end|>\n<|im_start|>assistant\n",
			"<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\n<tool_response>x</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\nr2\n</think>\n\nA2<|im_end|>\n"},
		{[]Message{{Role: "system", Content: "S"}, {Role: "system", Content: "S2"}, {Role: "user", Content: "Q"}},
			"<|im_start|>system\nS<|im_end|>\n<|im_start|>system\nS2<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n",
			"<|im_start|>system\nS<|im_end|>\n<|im_start|>system\nS2<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"},
		{[]Message{{Role: "user", Content: "Q"}, {Role: "tool", Content: "T1"}, {Role: "tool", Content: "T2"}, {Role: "user", Content: "Q2"}},
			"<|im_start|>user\nQ<|im_end|>\n<|im_start|>user\n<tool_response>\nT1\n</tool_response>\n<tool_response>\nT2\n</tool_response><|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n",
			"<|im_start|>user\nQ<|im_end|>\n<|im_start|>user\n<tool_response>\nT1\n</tool_response>\n<tool_response>\nT2\n</tool_response><|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n"},
		{[]Message{{Role: "assistant", Content: "only"}},
			"<|im_start|>assistant\nonly<|im_end|>\n<|im_start|>assistant\n",
			"<|im_start|>assistant\nonly<|im_end|>\n"},
	} {
		for _, gen := range []bool{true, false} {
			want := tc.plain
			if gen {
				want = tc.withGen
			}
			got, err := tpl.Render(tc.msgs, gen)
			if err != nil || got != want {
				t.Errorf("case %d (generation prompt %v): %v\n got %q\nwant %q", i, gen, err, got, want)
			}
		}
	}
}

// qwen3Template is the real Qwen3 chat template from its tokenizer_config.json.
func qwen3Template(t *testing.T) *Template {
	t.Helper()
	b, err := os.ReadFile("../../../testdata/tokenizers/qwen3/tokenizer_config.json")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ChatTemplate string `json:"chat_template"`
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	tpl, err := New(cfg.ChatTemplate, "", "<|im_end|>")
	if err != nil {
		t.Fatal(err)
	}
	return tpl
}
