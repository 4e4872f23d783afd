package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/batonlm/baton/internal/inspect"
)

func modelCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "model", Short: "Look at model files, or write random-weight ones for benchmarks"}
	cmd.AddCommand(&cobra.Command{
		Use:   "inspect PATH",
		Short: "Print what the loader sees in a GGUF file or Hugging Face directory",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			out, err := inspect.Inspect(args[0])
			if err != nil {
				return err
			}
			fmt.Fprint(cmd.OutOrStdout(), out)
			return nil
		},
	})
	cmd.AddCommand(modelSynthCmd())
	return cmd
}
