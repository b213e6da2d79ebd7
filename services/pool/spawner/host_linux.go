package spawner

import "syscall"

// procAttr gives the process its own group (so Close can end its children)
// and has the kernel kill it if the pool dies first.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
