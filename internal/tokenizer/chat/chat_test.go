package chat

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

const chatML = `{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}`

// llama2 is the Llama-2-chat template as published with the model.
const llama2 = `{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}`

var conversation = []Message{
	{Role: "system", Content: "Be brief."},
	{Role: "user", Content: "Hi"},
	{Role: "assistant", Content: "Hello!"},
	{Role: "user", Content: "Why is the sky blue?"},
}

func mustNew(t *testing.T, src string) *Template {
	t.Helper()
	tpl, err := New(src, "<s>", "</s>")
	if err != nil {
		t.Fatal(err)
	}
	return tpl
}

func TestChatML(t *testing.T) {
	tpl := mustNew(t, chatML)
	got, err := tpl.Render(conversation[:2], true)
	if err != nil {
		t.Fatal(err)
	}
	want := "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
	if got != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
	got, _ = tpl.Render(conversation[1:2], false)
	if want := "<|im_start|>user\nHi<|im_end|>\n"; got != want {
		t.Errorf("without generation prompt: %q", got)
	}
}

func TestLlama2(t *testing.T) {
	tpl := mustNew(t, llama2)
	got, err := tpl.Render(conversation, true)
	if err != nil {
		t.Fatal(err)
	}
	want := "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Why is the sky blue? [/INST]"
	if got != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
	_, err = tpl.Render([]Message{{Role: "user", Content: "a"}, {Role: "user", Content: "b"}}, true)
	var re *RaiseError
	if !errors.As(err, &re) || err.Error() != "Conversation roles must alternate user/assistant/user/assistant/..." {
		t.Errorf("alternation error = %v", err)
	}
}

func TestTrimAndLstripBlocks(t *testing.T) {
	src := "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}\nend"
	got, err := mustNew(t, src).Render(conversation, false)
	if err != nil {
		t.Fatal(err)
	}
	if want := "[Hi]\n[Why is the sky blue?]\nend"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestToJSON(t *testing.T) {
	src := `{{ messages[-1] | tojson }}|{{ {'b': 1, 'a': [1.5, 'x"y', 1e20, none, true]} | tojson }}|{{ 'héllo\n' | tojson }}|{{ 'é' | tojson(ensure_ascii=true) }}|{{ {'k': [1, 2]} | tojson(indent=2) }}|{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}|{{ messages[0] }}`
	got, err := mustNew(t, src).Render([]Message{{Role: "user", Content: "it's <b>"}}, false)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"role": "user", "content": "it's <b>"}|{"b": 1, "a": [1.5, "x\"y", 1e+20, null, true]}|"héllo\n"|"\u00e9"|{
  "k": [
    1,
    2
  ]
}|{"a": 2, "b": 1}|{'role': 'user', 'content': "it's <b>"}`
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestPythonisms(t *testing.T) {
	src := `{{ messages[-1].role }},{{ messages[-4]['content'] }},{{ messages[1:] | length }},{{ messages[0].get('role') }},{{ messages[1]['content'].strip() | upper }},{% for i in range(2) %}{{ i }}{% endfor %},{% set ns = namespace(n=0) %}{% for m in messages if m.role == 'user' %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }},{{ undefined_var is defined }}`
	got, err := mustNew(t, src).Render(conversation, false)
	if err != nil {
		t.Fatal(err)
	}
	if want := "user,Be brief.,3,system,HI,01,2,False"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestBrokenTemplates(t *testing.T) {
	for _, src := range []string{"{% for x in %}", "{{ 'unclosed", "{% if %}{% endif %}", "{% endfor %}", "", "  "} {
		if _, err := New(src, "", ""); err == nil {
			t.Errorf("New(%q) succeeded", src)
		}
	}
	for _, src := range []string{
		"{{ nothing.here }}",
		"{{ messages[0].content.no_such_method() }}",
		"{{ raise_exception(messages) }}",
		"{{ messages | no_such_filter }}",
		"{% for i in range(10000000) %}{% endfor %}",
		"{% include 'chat.go' %}",
		"{% include '/etc/passwd' %}",
		"{{ range | tojson }}",
		"{% include 'chat_template' %}",
		"{% extends 'chat_template' %}",
		"{% macro m(a) %}{{ m(a) }}{% endmacro %}{{ m(1) }}",
		"{% macro a() %}{{ b() }}{% endmacro %}{% macro b() %}{{ a() }}{% endmacro %}{{ a() }}",
		"{{ 'a' * -1 }}", // gonja panics inside
		"{{ 1 % 0 }}",    // gonja panics inside
	} {
		tpl, err := New(src, "", "")
		if err != nil {
			continue // refusing at parse time is fine too
		}
		out, err := tpl.Render(conversation, true)
		if err == nil {
			t.Errorf("Render(%q) = %q, want an error", src, out)
		}
	}
}

func TestPlain(t *testing.T) {
	got, err := Plain().Render(conversation[:2], true)
	if err != nil {
		t.Fatal(err)
	}
	if want := "system: Be brief.\n\nuser: Hi\n\nassistant: "; got != want {
		t.Errorf("got %q", got)
	}
}

func TestConcurrentRender(t *testing.T) {
	tpl := mustNew(t, llama2)
	want, _ := tpl.Render(conversation, true)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 50 {
				if got, err := tpl.Render(conversation, true); err != nil || got != want {
					t.Errorf("concurrent render: %q, %v", got, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestStrftime(t *testing.T) {
	tm := time.Date(2024, 7, 26, 15, 4, 5, 0, time.UTC)
	if got := strftime(tm, "%d %b %Y %H:%M:%S %A %B %y %j %% %q"); got != "26 Jul 2024 15:04:05 Friday July 24 208 % %q" {
		t.Errorf("strftime = %q", got)
	}
	out, err := mustNew(t, `{{ strftime_now("%Y") }}`).Render(nil, false)
	if err != nil || len(out) != 4 || !strings.HasPrefix(out, "20") {
		t.Errorf("strftime_now = %q, %v", out, err)
	}
}

func TestPyFloat(t *testing.T) {
	for f, want := range map[float64]string{
		1: "1.0", 1.5: "1.5", 1e16: "1e+16", 1e15: "1000000000000000.0", 0.0001: "0.0001",
		0.00001: "1e-05", -2.5e-7: "-2.5e-07", 123456789012345678: "1.2345678901234568e+17", 0.1: "0.1",
	} {
		if got := pyFloat(f); got != want {
			t.Errorf("pyFloat(%v) = %q, want %q", f, got, want)
		}
	}
}

func TestMacros(t *testing.T) {
	src := `{% macro show(m, prefix='> ') %}{{ prefix }}{{ m.role }}: {{ m.content }}
{% endmacro %}{% macro count(n) %}{% if n > 0 %}{{ n }}{{ count(n - 1) }}{% endif %}{% endmacro %}{% for m in messages %}{{ show(m) }}{% endfor %}{{ count(5) }}`
	got, err := mustNew(t, src).Render(conversation[:2], false)
	if err != nil {
		t.Fatal(err)
	}
	if want := "> system: Be brief.\n> user: Hi\n54321"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
