// Package docs holds the project's prose documents; its test keeps
// ARCHITECTURE.md's references to the code true.
package docs
