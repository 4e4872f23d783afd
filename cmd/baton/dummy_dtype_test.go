package main

import (
	"strings"
	"testing"
)

// --dummy-dtype's help names every dtype the flag takes. Before, it left
// out bf16, which parseDType (and the README's flag table) accept.
func TestDummyDTypeHelp(t *testing.T) {
	usage := serveCmd().Flags().Lookup("dummy-dtype").Usage
	for _, dt := range []string{"f32", "f16", "bf16", "q8_0"} {
		if _, err := parseDType(dt); err != nil {
			t.Fatalf("%s: %v", dt, err)
		}
		if !strings.Contains(usage, dt) {
			t.Errorf("--dummy-dtype help %q does not name %s", usage, dt)
		}
	}
}
