package cuda

import _ "embed"

// fatbin is kernels/*.cu compiled by `make kernels` (sm_80, sm_90 and
// compute_90 PTX); kernels.sha256 is the hash of the sources it was built
// from, checked by TestFatbinStamp.
//
//go:embed kernels.fatbin
var fatbin []byte
