package toolcall

import "strings"

// The formats below read output that a tool_choice grammar forced, with
// no --tool-call-parser on: the grammar already fixes the calls' JSON, so
// any model can be made to call a function, as vLLM serves named and
// required tool choices whatever the model.

// Named returns a parser for the output of a tool_choice naming function:
// the whole answer is the call's arguments object.
func Named(function string) *Parser {
	return &Parser{read: func(text string, final, _ bool) snapshot {
		args := text[wsLen(text):]
		done := final
		if n, complete, _ := scanValue(args); complete {
			args, done = args[:n], true
		}
		return snapshot{calls: []callSnap{{name: function, nameDone: true, args: args, argsDone: done}}}
	}}
}

// List returns a parser for the output of tool_choice "required": a JSON
// array of {"name": ..., "parameters": {...}} objects (vLLM's form; the
// key "arguments" is read too). Text that never became a call is content.
func List() *Parser {
	return &Parser{read: jsonList}
}

func jsonList(text string, final, _ bool) snapshot {
	var sn snapshot
	p := wsLen(text)
	if p < len(text) && text[p] == '[' {
		for p++; ; {
			p += wsLen(text[p:])
			if p >= len(text) || text[p] == ']' {
				break
			}
			if text[p] == ',' {
				p++
				continue
			}
			o := scanCall(text[p:], "parameters", "arguments")
			if !o.nameDone {
				break
			}
			sn.calls = append(sn.calls, snapOf(o))
			if o.bad || !o.done {
				sn.calls[len(sn.calls)-1].argsDone = o.bad
				break
			}
			p += o.end
		}
	}
	if final && len(sn.calls) == 0 {
		sn.content = strings.TrimSpace(text)
	}
	return sn
}
