//go:build !linux

package kvpool

func advise([]byte) {}
