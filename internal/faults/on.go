//go:build faults

package faults

import (
	"fmt"
	"os"
	"sync"
)

// Enabled is true in faults builds.
const Enabled = true

var (
	loadOnce  sync.Once
	spec      *Spec
	guardsOff map[string]bool
)

func load() {
	loadOnce.Do(func() {
		var err error
		if s := os.Getenv("BATON_FAULTS"); s != "" {
			if spec, err = ParseSpec(s); err != nil {
				fmt.Fprintln(os.Stderr, "baton:", err)
				os.Exit(2)
			}
		}
		if guardsOff, err = ParseGuards(os.Getenv("BATON_GUARDS_OFF")); err != nil {
			fmt.Fprintln(os.Stderr, "baton:", err)
			os.Exit(2)
		}
	})
}

// On reports whether a guard is on.
func On(guard string) bool {
	load()
	return !guardsOff[guard]
}

// Active is the configured fault spec, or nil.
func Active() *Spec {
	load()
	return spec
}
