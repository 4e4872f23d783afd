//go:build !faults

package faults

// Enabled is false outside faults builds: nothing here can be switched.
const Enabled = false

// On reports whether a guard is on: always, in this build.
func On(string) bool { return true }

// Active is the configured fault spec: none, in this build.
func Active() *Spec { return nil }
