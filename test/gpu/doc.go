// Package gpu holds the GPU-only model benchmarks that test/gpu/run.sh
// runs on a machine with an NVIDIA GPU (built there from binaries made by
// `make gpu-test-bins` on a machine with Go). Everywhere else they skip.
package gpu
