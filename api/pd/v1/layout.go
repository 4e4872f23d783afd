package pdv1

import (
	"fmt"
	"strings"
)

// LayoutDiff names every field in which two KV layouts differ, with both
// values; "" means one may write into the other's pages. aName and bName
// say whose each layout is ("prefill", "decode").
func LayoutDiff(a, b *KVLayout, aName, bName string) string {
	if a == nil || b == nil {
		switch {
		case a == nil && b == nil:
			return "layout (neither reported one)"
		case a == nil:
			return "layout (" + aName + " reported none)"
		default:
			return "layout (" + bName + " reported none)"
		}
	}
	var diffs []string
	add := func(field string, x, y any) {
		if x != y {
			diffs = append(diffs, fmt.Sprintf("%s (%s %v, %s %v)", field, aName, x, bName, y))
		}
	}
	add("model", a.GetModel(), b.GetModel())
	add("page_size", a.GetPageSize(), b.GetPageSize())
	add("dtype", a.GetDtype(), b.GetDtype())
	add("layers", a.GetLayers(), b.GetLayers())
	add("kv_heads", a.GetKvHeads(), b.GetKvHeads())
	add("head_dim", a.GetHeadDim(), b.GetHeadDim())
	return strings.Join(diffs, ", ")
}
