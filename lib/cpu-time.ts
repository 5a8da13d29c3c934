/**
 * CPU time of this process from `/proc/self/stat` (proc(5): fields 14-17 `utime`, `stime`,
 * `cutime`, `cstime`, in clock ticks of 1/100 s, the Linux `USER_HZ`). The children's fields count
 * only the children this process has waited for, so the difference of two readings around a
 * waited-for command is that command's CPU time.
 */
import { readFileSync } from 'node:fs'

/** CPU seconds: this process's threads (`user`, `system`) and its waited-for children (`childUser`, `childSystem`). */
export interface CpuTimes {
  user: number
  system: number
  childUser: number
  childSystem: number
}

/** Reads this process's {@link CpuTimes}; null where `/proc/self/stat` cannot be read (not Linux). */
export function cpuTimes(): CpuTimes | null {
  let stat: string
  try {
    stat = readFileSync('/proc/self/stat', 'utf8')
  } catch {
    return null
  }
  // The fields after the command name, which is in parentheses and may hold spaces: f[0] is
  // field 3 (state), so utime (field 14) is f[11].
  const f = stat
    .slice(stat.lastIndexOf(')') + 2)
    .split(' ')
    .map(Number)
  return { user: f[11]! / 100, system: f[12]! / 100, childUser: f[13]! / 100, childSystem: f[14]! / 100 }
}
