// Command fakebuild compiles the emulated CUDA driver and cuBLAS
// (internal/kernels/cuda/fakecuda) into a directory, for scripts that run
// the baton binary on it: with LD_LIBRARY_PATH set to that directory a
// process takes them for its CUDA installation (test/gpu/host-ceiling.sh).
package main

import (
	"fmt"
	"os"

	"github.com/batonlm/baton/internal/kernels/cuda/fakecuda"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: fakebuild DIR")
		os.Exit(2)
	}
	if err := fakecuda.Build(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
