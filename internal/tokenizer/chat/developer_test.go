package chat

import (
	"strings"
	"testing"
)

// TestDeveloperRendersAsSystem checks that OpenAI's developer role, which
// its SDKs send for newer models in place of system, reaches a template
// that knows only system as a system turn: the Qwen3 (ChatML) template
// tests role == "system" and would otherwise render nothing for it, and
// the plain fallback (the bundled stories260K has no template) would
// label it with a role the model never saw.
func TestDeveloperRendersAsSystem(t *testing.T) {
	msgs := []Message{{Role: "developer", Content: "Answer in French."}, {Role: "user", Content: "Hi"}}
	for _, tc := range []struct {
		name string
		tpl  *Template
		want string
	}{
		{"qwen3", qwen3Template(t), "<|im_start|>system\nAnswer in French.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"},
		{"plain", Plain(), "system: Answer in French.\n\nuser: Hi\n\nassistant: "},
	} {
		got, err := tc.tpl.Render(msgs, true)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got != tc.want {
			t.Errorf("%s: developer message rendered as\n%q\nwant\n%q", tc.name, got, tc.want)
		}
	}
}

// TestDeveloperKeptForTemplatesThatKnowIt leaves the role alone for a
// template that handles developer itself (gpt-oss's harmony template
// does), so its own rendering of the role wins.
func TestDeveloperKeptForTemplatesThatKnowIt(t *testing.T) {
	tpl, err := New(`{% for m in messages %}{% if m.role == "developer" %}[dev]{% endif %}{{ m.role }}:{{ m.content }};{% endfor %}`, "", "")
	if err != nil {
		t.Fatal(err)
	}
	got, err := tpl.Render([]Message{{Role: "developer", Content: "D"}, {Role: "user", Content: "U"}}, false)
	if err != nil {
		t.Fatal(err)
	}
	if want := "[dev]developer:D;user:U;"; got != want {
		t.Errorf("rendered %q, want %q", got, want)
	}
	if strings.Contains(got, "system") {
		t.Errorf("developer mapped to system for a template that knows it: %q", got)
	}
}
