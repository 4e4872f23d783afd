package grammar

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Whitespace policy of generated JSON: no whitespace anywhere except at
// most one space after each ':' and ','. A model cannot then spend its
// whole budget on whitespace, and the space keeps the ": " and ", " tokens
// that models were trained on.
var sp = optional(lit{" "})

// jsonBase are the rules every JSON grammar shares: any value, and the
// primitive types.
func jsonBase() []namedExpr {
	digits := rep{class{ranges: []rune{'0', '9'}}, 1, -1}
	integer := seq{optional(lit{"-"}), alt{lit{"0"}, seq{class{ranges: []rune{'1', '9'}}, star(class{ranges: []rune{'0', '9'}})}}}
	return []namedExpr{
		{"value", alt{ref{"object"}, ref{"array"}, ref{"string"}, ref{"number"}, lit{"true"}, lit{"false"}, lit{"null"}}},
		{"object", seq{lit{"{"}, optional(seq{ref{"member"}, star(seq{lit{","}, sp, ref{"member"}})}), lit{"}"}}},
		{"member", seq{ref{"string"}, lit{":"}, sp, ref{"value"}}},
		{"array", seq{lit{"["}, optional(seq{ref{"value"}, star(seq{lit{","}, sp, ref{"value"}})}), lit{"]"}}},
		// The body loops in one rule, closing quote included, so the mask
		// cache sees a whole string as one context.
		{"string", seq{lit{`"`}, ref{"string-body"}}},
		{"string-body", alt{seq{ref{"char"}, ref{"string-body"}}, lit{`"`}}},
		{"char", alt{
			class{ranges: negate([]rune{0, 0x1F, '"', '"', '\\', '\\'})},
			seq{lit{`\`}, alt{class{ranges: []rune{'"', '"', '\\', '\\', '/', '/', 'b', 'b', 'f', 'f', 'n', 'n', 'r', 'r', 't', 't'}},
				seq{lit{"u"}, rep{class{ranges: []rune{'0', '9', 'a', 'f', 'A', 'F'}}, 4, 4}}}},
		}},
		{"integer", integer},
		{"number", seq{integer, optional(seq{lit{"."}, digits}), optional(seq{class{ranges: []rune{'e', 'e', 'E', 'E'}}, optional(class{ranges: []rune{'+', '+', '-', '-'}}), digits})}},
		{"boolean", alt{lit{"true"}, lit{"false"}}},
		{"null", lit{"null"}},
	}
}

// JSONObject is the grammar of any JSON object (response_format
// json_object), with FromJSONSchema's whitespace policy.
func JSONObject() *Grammar {
	g, err := build(append(jsonBase(), namedExpr{"root", ref{"object"}}), "root")
	if err != nil {
		panic(err)
	}
	return g
}

// FromJSONSchema builds the grammar of the JSON texts valid under schema,
// written compactly: no whitespace except at most one space after each
// ':' and ','.
//
// Supported: type (one or a list), properties with required, emitted in
// schema order with optional ones omissible; additionalProperties (false
// unless given when properties are listed, any value otherwise); enum,
// const, items with minItems/maxItems, string minLength/maxLength, $ref to
// "#", "#/$defs/..." and "#/definitions/..." (recursion included), anyOf and
// oneOf as plain alternatives (oneOf's exclusivity is not enforced), allOf
// with one member, pattern (Go regexp syntax, unanchored as JSON Schema
// means it) and the formats date, time, date-time, uuid, ipv4 and email.
// Integer minimum, maximum, exclusiveMinimum and exclusiveMaximum are
// enforced; bounds on type number, other formats, multipleOf, uniqueItems
// and the like are not; pattern together with length bounds, and the combinators that
// need schema intersection (allOf of several, not, if/then), are refused.
func FromJSONSchema(schema string) (*Grammar, error) {
	v, err := parseJSON(schema)
	if err != nil {
		return nil, err
	}
	sc := &schemaCompiler{root: v, refs: map[string]string{}}
	body, err := sc.compile(v, 0)
	if err != nil {
		return nil, err
	}
	defs := append(jsonBase(), sc.defs...)
	defs = append(defs, namedExpr{"root", body})
	return build(defs, "root")
}

var errEmptyRange = errors.New("grammar: the integer bounds admit no value")

type schemaCompiler struct {
	// ns prefixes rule names, so several schemas can share one grammar.
	ns   string
	root *jval
	defs []namedExpr
	refs map[string]string // JSON pointer -> rule name
}

// maxSchemaDepth bounds recursion through nested (not $ref'd) schemas.
const maxSchemaDepth = 100

// maxRepeat bounds counted repetitions (maxItems, maxLength), each of which
// becomes that many rules.
const maxRepeat = 10000

func (sc *schemaCompiler) rule(prefix string, body expr) ref {
	name := fmt.Sprintf("%s%s-%d", sc.ns, prefix, len(sc.defs))
	sc.defs = append(sc.defs, namedExpr{name, body})
	return ref{name}
}

func (sc *schemaCompiler) compile(v *jval, depth int) (expr, error) {
	if depth > maxSchemaDepth {
		return nil, fmt.Errorf("grammar: schema nested too deeply")
	}
	switch v.kind {
	case 'b':
		if v.b {
			return ref{"value"}, nil
		}
		return nil, fmt.Errorf("grammar: schema false matches nothing")
	case 'o':
	default:
		return nil, fmt.Errorf("grammar: a schema must be an object or a boolean")
	}
	for _, k := range []string{"not", "if", "patternProperties", "dependentSchemas", "contains", "propertyNames"} {
		if v.get(k) != nil {
			return nil, fmt.Errorf("grammar: schema keyword %q is not supported", k)
		}
	}
	if r := v.get("$ref"); r != nil {
		if r.kind != 's' {
			return nil, fmt.Errorf("grammar: $ref must be a string")
		}
		return sc.ref(r.str)
	}
	if c := v.get("const"); c != nil {
		var sb strings.Builder
		c.encode(&sb)
		return lit{sb.String()}, nil
	}
	if e := v.get("enum"); e != nil {
		if e.kind != 'a' || len(e.vals) == 0 {
			return nil, fmt.Errorf("grammar: enum must be a non-empty array")
		}
		a := make(alt, len(e.vals))
		for i, x := range e.vals {
			var sb strings.Builder
			x.encode(&sb)
			a[i] = lit{sb.String()}
		}
		return a, nil
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		if xs := v.get(k); xs != nil {
			if xs.kind != 'a' || len(xs.vals) == 0 {
				return nil, fmt.Errorf("grammar: %s must be a non-empty array", k)
			}
			a := make(alt, 0, len(xs.vals))
			for _, x := range xs.vals {
				e, err := sc.compile(x, depth+1)
				if err != nil {
					return nil, err
				}
				a = append(a, e)
			}
			return a, nil
		}
	}
	if xs := v.get("allOf"); xs != nil {
		if xs.kind != 'a' || len(xs.vals) != 1 {
			return nil, fmt.Errorf("grammar: allOf is supported with one member only")
		}
		return sc.compile(xs.vals[0], depth+1)
	}
	t := v.get("type")
	switch {
	case t == nil:
		switch {
		case v.get("properties") != nil || v.get("required") != nil || v.get("additionalProperties") != nil:
			return sc.typed(v, "object", depth)
		case v.get("items") != nil || v.get("minItems") != nil || v.get("maxItems") != nil:
			return sc.typed(v, "array", depth)
		case v.get("minLength") != nil || v.get("maxLength") != nil:
			return sc.typed(v, "string", depth)
		}
		return ref{"value"}, nil
	case t.kind == 's':
		return sc.typed(v, t.str, depth)
	case t.kind == 'a' && len(t.vals) > 0:
		a := make(alt, 0, len(t.vals))
		for _, x := range t.vals {
			if x.kind != 's' {
				return nil, fmt.Errorf("grammar: type must name types")
			}
			e, err := sc.typed(v, x.str, depth)
			if err != nil {
				return nil, err
			}
			a = append(a, e)
		}
		return a, nil
	}
	return nil, fmt.Errorf("grammar: bad type")
}

// ref resolves a local JSON pointer to a rule, made once per target so that
// recursive schemas become recursive rules.
func (sc *schemaCompiler) ref(p string) (expr, error) {
	if name, ok := sc.refs[p]; ok {
		return ref{name}, nil
	}
	if !strings.HasPrefix(p, "#") {
		return nil, fmt.Errorf("grammar: only local $ref is supported, not %q", p)
	}
	target := sc.root
	if rest := strings.TrimPrefix(p[1:], "/"); rest != "" {
		for _, part := range strings.Split(rest, "/") {
			part = strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")
			var next *jval
			switch target.kind {
			case 'o':
				next = target.get(part)
			case 'a':
				if i, err := strconv.Atoi(part); err == nil && i >= 0 && i < len(target.vals) {
					next = target.vals[i]
				}
			}
			if next == nil {
				return nil, fmt.Errorf("grammar: $ref %q not found", p)
			}
			target = next
		}
	}
	name := fmt.Sprintf("%sref-%d", sc.ns, len(sc.refs))
	sc.refs[p] = name
	// Reserve the rule's place before compiling its body, which may refer
	// back to it.
	i := len(sc.defs)
	sc.defs = append(sc.defs, namedExpr{name: name})
	body, err := sc.compile(target, 0)
	if err != nil {
		return nil, err
	}
	sc.defs[i].body = body
	return ref{name}, nil
}

func intKeyword(v *jval, k string, def int) (int, error) {
	x := v.get(k)
	if x == nil {
		return def, nil
	}
	if x.kind != 'n' {
		return 0, fmt.Errorf("grammar: %s must be a number", k)
	}
	f, err := strconv.ParseFloat(x.str, 64)
	if err != nil || f < 0 || f != float64(int64(f)) {
		return 0, fmt.Errorf("grammar: %s must be a non-negative integer", k)
	}
	if f > maxRepeat {
		if def < 0 && strings.HasPrefix(k, "max") {
			return -1, nil // as good as unbounded
		}
		return 0, fmt.Errorf("grammar: %s above %d is not supported", k, maxRepeat)
	}
	return int(f), nil
}

func (sc *schemaCompiler) typed(v *jval, t string, depth int) (expr, error) {
	switch t {
	case "string":
		lo, err := intKeyword(v, "minLength", 0)
		if err != nil {
			return nil, err
		}
		hi, err := intKeyword(v, "maxLength", -1)
		if err != nil {
			return nil, err
		}
		pattern := ""
		if p := v.get("pattern"); p != nil {
			if p.kind != 's' {
				return nil, fmt.Errorf("grammar: pattern must be a string")
			}
			pattern = p.str
		} else if f := v.get("format"); f != nil && f.kind == 's' {
			pattern = formats[f.str] // unknown formats are annotations only
		}
		if pattern != "" {
			if lo != 0 || hi >= 0 {
				return nil, fmt.Errorf("grammar: pattern or format with minLength/maxLength is not supported")
			}
			body, err := jsonStringPattern(pattern)
			if err != nil {
				return nil, err
			}
			return sc.rule("pattern", seq{lit{`"`}, body, lit{`"`}}), nil
		}
		if lo == 0 && hi < 0 {
			return ref{"string"}, nil
		}
		if hi >= 0 && lo > hi {
			return nil, fmt.Errorf("grammar: minLength above maxLength")
		}
		return sc.rule("string", seq{lit{`"`}, rep{ref{"char"}, lo, hi}, lit{`"`}}), nil
	case "integer":
		lo, hi, ok, err := intBounds(v)
		if err != nil {
			return nil, err
		}
		if ok {
			return sc.rule("int-range", intRange(lo, hi)), nil
		}
		return ref{t}, nil
	case "number", "boolean", "null":
		return ref{t}, nil
	case "array":
		return sc.array(v, depth)
	case "object":
		return sc.object(v, depth)
	}
	return nil, fmt.Errorf("grammar: unknown type %q", t)
}

// formats are the string formats generated exactly, as patterns. They
// follow RFC 3339 and friends closely enough for validators that assert
// formats (February stops at the 28th: leap years are beyond a pattern);
// others are left unconstrained.
var formats = map[string]string{
	"date":      `^\d{4}-((0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|(0[469]|11)-(0[1-9]|[12]\d|30)|02-(0[1-9]|1\d|2[0-8]))$`,
	"time":      `^([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,9})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)$`,
	"date-time": `^\d{4}-((0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|(0[469]|11)-(0[1-9]|[12]\d|30)|02-(0[1-9]|1\d|2[0-8]))T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,9})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)$`,
	"uuid":      `^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`,
	"ipv4":      `^((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)$`,
	// The local part and labels are kept short so that the counted
	// repetitions stay small and no part can exceed RFC 5321's limits.
	"email": `^[a-zA-Z0-9_%+-]{1,16}(\.[a-zA-Z0-9_%+-]{1,16}){0,2}@[a-zA-Z0-9]([a-zA-Z0-9-]{0,20}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,20}[a-zA-Z0-9])?){0,3}\.[a-zA-Z]{2,12}$`,
}

func (sc *schemaCompiler) array(v *jval, depth int) (expr, error) {
	if v.get("prefixItems") != nil {
		return nil, fmt.Errorf("grammar: prefixItems is not supported")
	}
	var item expr = ref{"value"}
	if it := v.get("items"); it != nil {
		e, err := sc.compile(it, depth+1)
		if err != nil {
			return nil, err
		}
		item = sc.rule("item", e)
	}
	lo, err := intKeyword(v, "minItems", 0)
	if err != nil {
		return nil, err
	}
	hi, err := intKeyword(v, "maxItems", -1)
	if err != nil {
		return nil, err
	}
	if hi >= 0 && lo > hi {
		return nil, fmt.Errorf("grammar: minItems above maxItems")
	}
	if hi == 0 {
		return lit{"[]"}, nil
	}
	restHi := -1
	if hi > 0 {
		restHi = hi - 1
	}
	var items expr = seq{item, rep{seq{lit{","}, sp, item}, max(lo-1, 0), restHi}}
	if lo == 0 {
		items = optional(items)
	}
	return sc.rule("array", seq{lit{"["}, items, lit{"]"}}), nil
}

// object emits the listed properties in schema order. Commas are placed
// by two chains of rules: first_i generates properties i.. where none has
// been emitted yet, rest_i those after one has, each with its comma.
func (sc *schemaCompiler) object(v *jval, depth int) (expr, error) {
	props := v.get("properties")
	if props != nil && props.kind != 'o' {
		return nil, fmt.Errorf("grammar: properties must be an object")
	}
	required := map[string]bool{}
	if r := v.get("required"); r != nil {
		if r.kind != 'a' {
			return nil, fmt.Errorf("grammar: required must be an array")
		}
		for _, x := range r.vals {
			if x.kind != 's' {
				return nil, fmt.Errorf("grammar: required must list names")
			}
			required[x.str] = true
		}
	}
	var extra expr // additional member, or nil for none
	switch ap := v.get("additionalProperties"); {
	case ap == nil && props == nil:
		extra = ref{"member"}
	case ap == nil, ap.kind == 'b' && !ap.b:
	case ap.kind == 'b':
		extra = ref{"member"}
	default:
		e, err := sc.compile(ap, depth+1)
		if err != nil {
			return nil, err
		}
		extra = seq{ref{"string"}, lit{":"}, sp, e}
	}
	var names []string
	var kvs []expr
	if props != nil {
		for i, k := range props.keys {
			e, err := sc.compile(props.vals[i], depth+1)
			if err != nil {
				return nil, err
			}
			names = append(names, k)
			kvs = append(kvs, seq{lit{jsonString(k) + ":"}, sp, e})
		}
	}
	for k := range required {
		found := false
		for _, n := range names {
			found = found || n == k
		}
		if !found && extra == nil {
			return nil, fmt.Errorf("grammar: required property %q is not allowed by the schema", k)
		}
	}
	// The tails: after the listed properties, any number of additional
	// members.
	var first, rest expr = empty, empty
	if extra != nil {
		more := star(seq{lit{","}, sp, extra})
		first = optional(seq{extra, more})
		rest = more
	}
	for i := len(kvs) - 1; i >= 0; i-- {
		withComma := seq{lit{","}, sp, kvs[i], rest}
		withoutComma := seq{kvs[i], rest}
		if required[names[i]] {
			rest = sc.rule("rest", withComma)
			first = sc.rule("first", withoutComma)
		} else {
			rest = sc.rule("rest", alt{withComma, rest})
			first = sc.rule("first", alt{withoutComma, first})
		}
	}
	return sc.rule("object", seq{lit{"{"}, first, lit{"}"}}), nil
}
