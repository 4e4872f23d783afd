package main

import (
	"context"
	"fmt"
	"io"
)

func runRouter(ctx context.Context, f *serveFlags, logw io.Writer) error {
	return fmt.Errorf("router role: not wired yet")
}
