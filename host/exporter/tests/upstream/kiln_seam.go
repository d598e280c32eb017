package transformation

// kilnPIDMapper is the one seam kiln's golden harness adds to upstream's code: the pid → pod
// UID step (normally /proc/<pid>/cgroup) is answered from a table.
var kilnPIDMapper = func() PIDMapper { return newPIDToPodMapper() }
