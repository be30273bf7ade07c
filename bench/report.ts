/* What every scenario returns: its section of results.md and the verdicts on its targets. */
import type { Postgres } from './servers.js'

export interface Verdict {
  scenario: string
  target: string
  measured: string
  met: boolean | undefined
}

export interface Section {
  title: string
  lines: string[]
  verdicts: Verdict[]
}

/** Scenarios that share their servers: run with the ids of them that were asked for. */
export interface ScenarioGroup {
  ids: string[]
  run: (postgres: Postgres, ids: string[]) => Promise<Section>
}

export const verdict = (scenario: string, target: string, measured: string, met: boolean | undefined): Verdict =>
  ({ scenario, target, measured, met })
export const ratioText = (value: number | undefined): string => value === undefined ? 'n/a' : value.toFixed(2)
export const mb = (bytes: number): string => (bytes / 2 ** 20).toFixed(0)
export const row = (cells: string[]): string => `| ${cells.join(' | ')} |`

/** The list in the order of a round: each round starts one later, so that drifting load hits every entry alike. */
export const rotate = <T>(list: T[], round: number): T[] =>
  [...list.slice(round % list.length), ...list.slice(0, round % list.length)]

export const header = (cells: string[]): string[] => [row(cells), row(cells.map((_, i) => i === 0 ? '---' : '---:'))]
