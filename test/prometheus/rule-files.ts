import { readFileSync } from 'node:fs'
import { parse, stringify } from 'yaml'

/** The rules and the dashboard as deployed (links into the chart's files/), read as the tests need them. */
export const RULES_FILE = 'deploy/prometheus/petstore-rules.yaml'
export const DASHBOARD_FILE = 'deploy/grafana/petstore-dashboard.json'

interface Rule {
  record?: string
  alert?: string
  expr: string
  for?: string
  labels?: Record<string, string>
  annotations?: Record<string, string>
}
interface RuleGroup { name: string, interval?: string, rules: Rule[] }

export interface AlertRule extends Rule {
  alert: string
  labels: Record<string, string>
  annotations: Record<string, string>
}
export interface RecordingRule extends Rule { record: string }

const groups = (): RuleGroup[] => (parse(readFileSync(RULES_FILE, 'utf8')) as { groups: RuleGroup[] }).groups

export const alertRules = (): AlertRule[] =>
  groups().flatMap(group => group.rules.filter((rule): rule is AlertRule => rule.alert !== undefined))

export const recordingRules = (): RecordingRule[] =>
  groups().flatMap(group => group.rules.filter((rule): rule is RecordingRule => rule.record !== undefined))

/**
 * The rules file as a test's Prometheus loads it: every group evaluated each `interval` and every alert's `for`
 * shortened to `holdFor`; the expressions, labels and annotations untouched.
 */
export function quickRules (interval: string, holdFor: string): string {
  const quick = groups().map(group => ({
    ...group,
    interval,
    rules: group.rules.map(rule => rule.alert === undefined ? rule : { ...rule, for: holdFor })
  }))
  return stringify({ groups: quick })
}

export interface DashboardQuery { panel: string, expr: string }
interface Target { expr?: string }
interface Panel { title: string, type: string, targets?: Target[], panels?: Panel[] }
export interface Variable { name: string, type: string, query?: string | { query: string }, regex?: string }
interface Dashboard { panels: Panel[], templating: { list: Variable[] } }

const dashboard = (): Dashboard => JSON.parse(readFileSync(DASHBOARD_FILE, 'utf8')) as Dashboard

/** Every query of every panel (rows' collapsed panels included), with Grafana's variables still in it. */
export function dashboardQueries (): DashboardQuery[] {
  const panels = dashboard().panels.flatMap(panel => [panel, ...(panel.panels ?? [])])
  return panels.flatMap(panel => (panel.targets ?? [])
    .filter((target): target is { expr: string } => typeof target.expr === 'string')
    .map(target => ({ panel: panel.title, expr: target.expr })))
}

export const dashboardVariables = (): Variable[] => dashboard().templating.list
