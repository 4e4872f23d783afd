package cuda

import "path/filepath"

// OpenAt is Open with the driver and cuBLAS loaded from dir
// (libcuda.so.1, libcublas.so.12) rather than the loader's path: an
// installation the process was not started with, such as the emulated
// driver other packages' tests build (fakecuda).
func OpenAt(dir string, deviceIndex int) (*Backend, error) {
	return open(libs{driver: []string{filepath.Join(dir, "libcuda.so.1")}, cublas: []string{filepath.Join(dir, "libcublas.so.12")}}, deviceIndex)
}
