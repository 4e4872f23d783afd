// Package chat renders a conversation into a prompt with the model's
// Jinja chat template (tokenizer.chat_template in the GGUF), as Hugging
// Face transformers' apply_chat_template does.
//
// Templates run with trim_blocks and lstrip_blocks on, like transformers.
// They see the variables messages (a list of {"role", "content"} dicts, with
// "name" when the message has one), any extra variables given to RenderWith,
// add_generation_prompt, bos_token and eos_token, and the functions
// raise_exception(msg), which makes Render fail with msg, and
// strftime_now(format). The tojson filter formats like Python's
// json.dumps (", " and ": " separators, non-ASCII kept unless
// ensure_ascii=true), which is what transformers installs.
//
// Models without a template can use Plain, whose documented fallback
// format is, for each message,
//
//	{role}: {content}\n\n
//
// followed by "assistant: " when a generation prompt is asked for.
package chat

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nikolalohinski/gonja/v2/builtins"
	controlStructures "github.com/nikolalohinski/gonja/v2/builtins/control_structures"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"
	"github.com/nikolalohinski/gonja/v2/nodes"
	"github.com/nikolalohinski/gonja/v2/parser"
)

// Message is one turn of a conversation. Name, when set, reaches the
// template as the message's "name" key, as transformers passes it.
type Message struct {
	Role    string
	Content string
	Name    string
	// ToolCalls reach the template as the message's "tool_calls",
	// ToolCallID as "tool_call_id" (a tool turn's answer to a call).
	ToolCalls  []ToolCall
	ToolCallID string
}

// Reserved are the variables a request's chat_template_kwargs may not set:
// those Render sets itself (messages, add_generation_prompt, bos_token,
// eos_token and the functions), and those a server fills from a request's
// own fields after checking them (tools; documents, which transformers
// passes the same way). Set from the kwargs, tools would reach the
// template unchecked.
var Reserved = []string{"messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token",
	"raise_exception", "strftime_now", "range"}

// Template renders conversations. It is safe for concurrent use.
type Template struct {
	tpl      *exec.Template // nil for Plain
	bos, eos string
	// developer says the template itself handles the developer role.
	// Most templates predate it and test only for "system", so they
	// would render a developer turn as nothing at all.
	developer bool
}

// developerRole is OpenAI's newer name for the system role, which its SDKs
// send for newer models.
const developerRole = "developer"

// role is the role a message reaches the template under: developer
// becomes system unless the template knows developer, as vLLM and
// SGLang do before templating.
func (t *Template) role(r string) string {
	if r == developerRole && !t.developer {
		return "system"
	}
	return r
}

// RaiseError is the error Render returns when the template calls
// raise_exception; it usually means the conversation breaks the model's
// rules (say, roles that do not alternate), so it is the caller's fault.
type RaiseError struct {
	Message string
}

// Error returns the template's message unchanged.
func (e *RaiseError) Error() string { return e.Message }

// rootName identifies the template to its loader; there is nothing else to
// load.
const rootName = "chat_template"

// environment is shared by all templates; it is never modified after init.
var environment = newEnvironment()

func newEnvironment() *exec.Environment {
	filters := exec.NewFilterSet(map[string]exec.FilterFunction{}).Update(builtins.Filters)
	if err := filters.Replace("tojson", filterToJSON); err != nil {
		panic(err)
	}
	globals := exec.EmptyContext().Update(builtins.GlobalFunctions).Update(builtins.GlobalVariables)
	// gonja's range feeds a channel from a goroutine that leaks when a loop
	// stops early; a list has no such problem.
	globals.Set("range", rangeFunction)
	globals.Set("strftime_now", strftimeNow)
	controls := exec.NewControlStructureSet(map[string]parser.ControlStructureParser{}).Update(builtins.ControlStructures)
	macroParser, _ := controls.Get("macro")
	if err := controls.Replace("macro", func(p, args *parser.Parser) (nodes.ControlStructure, error) {
		cs, err := macroParser(p, args)
		if m, ok := cs.(*controlStructures.MacroControlStructure); ok && err == nil {
			return limitedMacro{m}, nil
		}
		return cs, err
	}); err != nil {
		panic(err)
	}
	return &exec.Environment{
		Context:           globals,
		Filters:           filters,
		Tests:             builtins.Tests,
		ControlStructures: controls,
		Methods:           builtins.Methods,
	}
}

// maxMacroDepth bounds macro recursion. Unbounded recursion would overflow
// the goroutine stack, which kills the whole process rather than panicking.
const maxMacroDepth = 100

// limitedMacro defines a macro like gonja does, but refuses to nest calls
// deeper than maxMacroDepth.
type limitedMacro struct {
	*controlStructures.MacroControlStructure
}

// Execute binds the macro's name for the rest of the render.
func (m limitedMacro) Execute(r *exec.Renderer, _ *nodes.ControlStructureBlock) error {
	macro, err := exec.MacroNodeToFunc(m.Macro, r)
	if err != nil {
		return fmt.Errorf("macro %q: %w", m.Name, err)
	}
	depth := 0 // each render defines the macro afresh, so this is per render
	r.Environment.Context.Set(m.Name, exec.Macro(func(params *exec.VarArgs) *exec.Value {
		if depth >= maxMacroDepth {
			return exec.AsValue(fmt.Errorf("macro %q recurses deeper than %d calls", m.Name, maxMacroDepth))
		}
		depth++
		defer func() { depth-- }()
		return macro(params)
	}))
	return nil
}

// New parses a Jinja chat template. bos and eos are the texts of the BOS
// and EOS tokens, exposed to the template as bos_token and eos_token.
func New(template, bos, eos string) (t *Template, err error) {
	if strings.TrimSpace(template) == "" {
		return nil, errors.New("chat: empty template")
	}
	defer func() {
		if r := recover(); r != nil {
			t, err = nil, fmt.Errorf("chat: parsing template: panic: %v", r)
		}
	}()
	cfg := config.New()
	cfg.TrimBlocks = true
	cfg.LeftStripBlocks = true
	tpl, err := exec.NewTemplate(rootName, cfg, &singleLoader{src: template}, environment)
	if err != nil {
		// gonja quotes the whole source in its message; keep only the cause.
		msg := strings.TrimPrefix(err.Error(), "failed to parse template '"+template+"': ")
		return nil, fmt.Errorf("chat: parsing template: %s", msg)
	}
	return &Template{tpl: tpl, bos: bos, eos: eos, developer: strings.Contains(template, developerRole)}, nil
}

// Plain returns the fallback template for models that ship none (see the
// package documentation for its format).
func Plain() *Template { return &Template{} }

// Render formats messages as a prompt. With addGenerationPrompt the prompt
// ends where the assistant's reply should start. A template that fails, or
// even panics, yields an error; raise_exception yields a *RaiseError.
func (t *Template) Render(messages []Message, addGenerationPrompt bool) (out string, err error) {
	return t.RenderWith(messages, addGenerationPrompt, nil)
}

// RenderWith is Render with extra template variables (a request's
// chat_template_kwargs, such as enable_thinking, and its tools). The
// variables Render sets itself cannot be replaced: the conversation is
// not theirs to replace.
func (t *Template) RenderWith(messages []Message, addGenerationPrompt bool, vars map[string]any) (out string, err error) {
	return t.RenderEscaped(messages, addGenerationPrompt, vars, nil)
}

// RenderEscaped is RenderWith that passes every string of the messages and
// of vars (names and values, however deep) through escape first, and none
// of the template's own text: with the tokenizer's EscapeSpecial, the
// template's markup becomes control tokens and the same markup written by
// a client stays text. A nil escape changes nothing.
func (t *Template) RenderEscaped(messages []Message, addGenerationPrompt bool, vars map[string]any, escape func(string) string) (out string, err error) {
	if escape != nil {
		messages = escapeMessages(messages, escape)
		if vars != nil {
			vars = escapeValue(vars, escape, 0).(map[string]any)
		}
	}
	if t.tpl == nil {
		return renderPlain(t, messages, addGenerationPrompt), nil
	}
	var raised *RaiseError
	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("chat: rendering template: panic: %v", r)
		}
	}()
	msgs := make(messageList, len(messages))
	for i, m := range messages {
		msgs[i] = message{"role": t.role(m.Role), "content": m.Content}
		if m.Name != "" {
			msgs[i]["name"] = m.Name
		}
		if len(m.ToolCalls) > 0 {
			msgs[i]["tool_calls"] = toolCallsValue(m.ToolCalls)
		}
		if m.ToolCallID != "" {
			msgs[i]["tool_call_id"] = m.ToolCallID
		}
	}
	ctx := make(map[string]any, len(vars)+5)
	for k, v := range vars {
		ctx[k] = v
	}
	for k, v := range map[string]any{
		"messages":              msgs,
		"add_generation_prompt": addGenerationPrompt,
		"bos_token":             t.bos,
		"eos_token":             t.eos,
		"raise_exception": func(args *exec.VarArgs) (any, error) {
			raised = &RaiseError{Message: args.First().String()}
			return nil, raised
		},
	} {
		ctx[k] = v
	}
	out, err = t.tpl.ExecuteToString(exec.NewContext(ctx))
	if raised != nil {
		return "", raised
	}
	if err != nil {
		return "", fmt.Errorf("chat: rendering template: %w", err)
	}
	return out, nil
}

func renderPlain(t *Template, messages []Message, addGenerationPrompt bool) string {
	var sb strings.Builder
	for _, m := range messages {
		sb.WriteString(t.role(m.Role))
		sb.WriteString(": ")
		sb.WriteString(m.Content)
		sb.WriteString("\n\n")
	}
	if addGenerationPrompt {
		sb.WriteString("assistant: ")
	}
	return sb.String()
}

// singleLoader hands gonja the template source once and refuses every
// later request, so that {% include %}, {% import %} or {% extends %} in a
// model file can neither read local files nor pull in the template itself
// and recurse without end.
type singleLoader struct {
	src  string
	used atomic.Bool
}

func (l *singleLoader) Read(path string) (io.Reader, error) {
	if path != rootName || !l.used.CompareAndSwap(false, true) {
		return nil, fmt.Errorf("templates cannot load %q", path)
	}
	return strings.NewReader(l.src), nil
}

func (l *singleLoader) Resolve(path string) (string, error) {
	return "", fmt.Errorf("templates cannot load %q", path)
}

func (l *singleLoader) Inherit(string) (loaders.Loader, error) { return l, nil }

// message is one conversation turn as the template sees it: a dict with
// "role" and "content". Its own type lets it print and serialise with the
// keys in that order, as a Python dict would.
type message map[string]any

var messageKeyOrder = []string{"role", "content"}

func (m message) String() string {
	var sb strings.Builder
	sb.WriteByte('{')
	for i, k := range orderedKeys(m) {
		if i > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString(pyRepr(k))
		sb.WriteString(": ")
		if s, ok := m[k].(string); ok {
			sb.WriteString(pyRepr(s))
		} else {
			sb.WriteString(exec.ToValue(m[k]).String())
		}
	}
	sb.WriteByte('}')
	return sb.String()
}

// messageList is the messages variable. gonja's own list indexing rejects
// messages[-len(messages)]; this type answers negative indexes the Python
// way.
type messageList []message

// GetItem implements exec.ItemGetter.
func (l messageList) GetItem(key any) (*exec.Value, bool) {
	i, ok := key.(int)
	if !ok {
		return exec.AsValue(nil), false
	}
	if i < 0 {
		i += len(l)
	}
	if i < 0 || i >= len(l) {
		return exec.AsValue(nil), false
	}
	return exec.ToValue(l[i]), true
}

// rangeFunction is Python's range, returning a list.
func rangeFunction(args *exec.VarArgs) ([]int, error) {
	ints := make([]int, len(args.Args))
	for i, a := range args.Args {
		if !a.IsInteger() {
			return nil, fmt.Errorf("range: %s is not an integer", a.String())
		}
		ints[i] = a.Integer()
	}
	start, stop, step := 0, 0, 1
	switch len(ints) {
	case 1:
		stop = ints[0]
	case 2:
		start, stop = ints[0], ints[1]
	case 3:
		start, stop, step = ints[0], ints[1], ints[2]
	default:
		return nil, errors.New("range expects 1 to 3 integers")
	}
	if step == 0 {
		return nil, errors.New("range: step must not be zero")
	}
	n := 0
	if step > 0 && stop > start {
		n = (stop - start + step - 1) / step
	} else if step < 0 && stop < start {
		n = (start - stop - step - 1) / -step
	}
	const maxRange = 1 << 20 // a template has no business building more
	if n > maxRange {
		return nil, fmt.Errorf("range of %d items is too long", n)
	}
	out := make([]int, n)
	for i := range out {
		out[i] = start + i*step
	}
	return out, nil
}

// strftimeNow formats the current local time with a C strftime format, as
// transformers' strftime_now does; recent Llama templates use it for the
// date in the system prompt.
func strftimeNow(format string) string {
	return strftime(time.Now(), format)
}

func strftime(t time.Time, format string) string {
	var sb strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 == len(format) {
			sb.WriteByte(c)
			continue
		}
		i++
		switch format[i] {
		case 'Y':
			fmt.Fprintf(&sb, "%04d", t.Year())
		case 'y':
			fmt.Fprintf(&sb, "%02d", t.Year()%100)
		case 'm':
			fmt.Fprintf(&sb, "%02d", int(t.Month()))
		case 'd':
			fmt.Fprintf(&sb, "%02d", t.Day())
		case 'e':
			fmt.Fprintf(&sb, "%2d", t.Day())
		case 'B':
			sb.WriteString(t.Month().String())
		case 'b', 'h':
			sb.WriteString(t.Month().String()[:3])
		case 'A':
			sb.WriteString(t.Weekday().String())
		case 'a':
			sb.WriteString(t.Weekday().String()[:3])
		case 'H':
			fmt.Fprintf(&sb, "%02d", t.Hour())
		case 'I':
			fmt.Fprintf(&sb, "%02d", (t.Hour()+11)%12+1)
		case 'p':
			if t.Hour() < 12 {
				sb.WriteString("AM")
			} else {
				sb.WriteString("PM")
			}
		case 'M':
			fmt.Fprintf(&sb, "%02d", t.Minute())
		case 'S':
			fmt.Fprintf(&sb, "%02d", t.Second())
		case 'j':
			fmt.Fprintf(&sb, "%03d", t.YearDay())
		case 'Z':
			name, _ := t.Zone()
			sb.WriteString(name)
		case '%':
			sb.WriteByte('%')
		default:
			sb.WriteByte('%')
			sb.WriteByte(format[i])
		}
	}
	return sb.String()
}
