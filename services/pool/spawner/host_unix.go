//go:build unix

package spawner

import "syscall"

func hostSysProcAttr() *syscall.SysProcAttr {
	return procAttr()
}

func killProcessGroup(pid int) {
	_ = syscall.Kill(-pid, syscall.SIGKILL)
}
