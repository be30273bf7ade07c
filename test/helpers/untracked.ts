/*
 * tap's @tapjs/processinfo puts its loader into the NODE_OPTIONS of every process a test starts, whatever
 * environment the test passes. The processes tests start must not write coverage: they run the build, whose source
 * maps name the same src/*.ts with other maps, and a second map for a file made tap's report drop that file's
 * coverage (src/ under the threshold in CI); as another user, they could not write into .tap at all. And before
 * Node 24.13 the loader runs each module load through a hooks thread, which more than doubled a child's CPU (the
 * keys command: 1.9 CPU s, 0.85 without). So they start without it: `env -u NODE_OPTIONS` drops the variable after
 * the spawn, where the loader no longer adds it.
 */

/** The command line that runs `command` with `args` without tap's loader. */
export function untracked (command: string, args: readonly string[]): [string, string[]] {
  return ['env', ['-u', 'NODE_OPTIONS', command, ...args]]
}
