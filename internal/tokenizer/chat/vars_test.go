package chat

import "testing"

func TestNameAndVariablesReachTheTemplate(t *testing.T) {
	tpl, err := New(`{% for m in messages %}{{ m.role }}{% if m.name is defined %}({{ m.name }}){% endif %}:{{ m.content }};{% endfor %}`+
		`{% if enable_thinking is defined and not enable_thinking %}[no-think]{% endif %}{{ depth | default(0) }}`, "", "")
	if err != nil {
		t.Fatal(err)
	}
	msgs := []Message{{Role: "user", Content: "hi", Name: "ann"}, {Role: "assistant", Content: "yo"}}
	for _, c := range []struct {
		vars map[string]any
		want string
	}{
		{nil, "user(ann):hi;assistant:yo;0"},
		{map[string]any{"enable_thinking": false, "depth": int64(3)}, "user(ann):hi;assistant:yo;[no-think]3"},
		{map[string]any{"enable_thinking": true}, "user(ann):hi;assistant:yo;0"},
		// A variable may not replace the conversation.
		{map[string]any{"messages": []any{}}, "user(ann):hi;assistant:yo;0"},
	} {
		got, err := tpl.RenderWith(msgs, false, c.vars)
		if err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("vars %v: got %q, want %q", c.vars, got, c.want)
		}
	}
}
