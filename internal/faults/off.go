//go:build !faults

package faults

// Enabled is false outside faults builds: nothing here can be switched.
const Enabled = false

// There is no On here: a file that asks whether a guard is on carries the
// faults tag itself, so release code cannot so much as name the question.

// Active is the configured fault spec: none, in this build.
func Active() *Spec { return nil }
