package main

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/batonlm/baton/internal/kernels/cpu"
)

func envCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "env",
		Short: "Describe this machine as baton sees it: CPU kernels, threads",
		RunE: func(cmd *cobra.Command, _ []string) error {
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "baton %s, %s/%s, %d CPUs\n", version, runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
			fmt.Fprintf(w, "cpu kernels: %s\n", cpu.New(0).Features())
			fmt.Fprintln(w, "gpu: none (this build has only CPU kernels)")
			return nil
		},
	}
}
