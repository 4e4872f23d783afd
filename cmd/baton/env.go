package main

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/batonlm/baton/internal/kernels/cpu"
	"github.com/batonlm/baton/internal/kernels/cuda"
	"github.com/batonlm/baton/internal/transfer/rdma"
	"github.com/batonlm/baton/internal/transfer/ucx"
)

func envCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "env",
		Short: "Describe this machine as baton sees it: CPU kernels, threads",
		RunE: func(cmd *cobra.Command, _ []string) error {
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "baton %s, %s/%s, %d CPUs\n", version, runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
			fmt.Fprintf(w, "cpu kernels: %s\n", cpu.New(0).Features())
			fmt.Fprintf(w, "rdma devices: %s\n", rdma.Summary())
			if ucx.Enabled {
				if rs, err := ucx.Transports(); err != nil {
					fmt.Fprintf(w, "ucx: %v\n", err)
				} else {
					fmt.Fprintln(w, ucx.Describe(rs))
				}
				// Whether KV pages can go GPU to GPU over ucx here
				// (a decode pool registered in place, prefill's arena).
				if cuda, err := ucx.CUDAMemory(); err != nil {
					fmt.Fprintf(w, "ucx GPU memory: %v\n", err)
				} else if cuda {
					fmt.Fprintln(w, "ucx GPU memory: yes (GPU pools are registered with UCX)")
				} else {
					fmt.Fprintln(w, "ucx GPU memory: no (this UCX build cannot register CUDA memory; GPU pools' pages go through host memory)")
				}
			} else {
				fmt.Fprintln(w, "ucx: not in this build (build with -tags ucx)")
			}
			if line, err := cuda.Probe(); err != nil {
				fmt.Fprintf(w, "cuda: not usable: %v\n", err)
			} else {
				fmt.Fprintf(w, "cuda: %s\n", line)
			}
			return nil
		},
	}
}
