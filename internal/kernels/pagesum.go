package kernels

import "encoding/binary"

// PageSum is the checksum of a page's packed rows (PackPage's layout) that
// a GPU computes where the page is, without reading it back: a sum over
// the rows' 2-byte units u_i of mix(i<<16 | u_i), plus the unit count, all
// mod 2^64. Each term is a bijection of (i, u_i), so changing any unit or
// moving one changes the sum, and a sum can be taken in any order (a
// block per page, atomics across blocks) and still be the same number.
// It guards against faults (a short, torn, misplaced or late write), not
// against a forger: whoever can write a page can also compute its sum.
// The cuda-ipc transport's Commits carry it in place of the xxh3 of
// transfer.Checksum, so neither worker reads its pages back to the host.
func PageSum(packed []byte) uint64 {
	n := len(packed) / 2
	sum := uint64(n) * PageSumUnitWeight
	for i := range n {
		sum += SumTerm(uint64(i), binary.LittleEndian.Uint16(packed[2*i:]))
	}
	return sum
}

// PageSumUnitWeight weighs the unit count into PageSum, so that a page
// cut short by whole zero units still differs.
const PageSumUnitWeight = 0x9e3779b97f4a7c15

// SumTerm is PageSum's term for unit u at index i: splitmix64's finaliser,
// a bijection on 64 bits (the kernels compute the same).
func SumTerm(i uint64, u uint16) uint64 {
	x := i<<16 | uint64(u)
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// PageSummer is a DeviceKV that computes PageSum of pages where they are:
// sums[i] is PageSum of the first tokens[i] slots of pages[i], packed,
// after the kernels queued before it that store into those pages.
type PageSummer interface {
	SumPages(pages []int32, tokens []int) ([]uint64, error)
}
