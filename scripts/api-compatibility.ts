import { apiCompare } from 'api-smart-diff'

/*
 * Which changes between two OpenAPI documents break existing clients, by operation.
 * api-smart-diff classifies each change; on top of it, a response member that
 * disappears is breaking (a client reads it), although a narrower response is
 * compatible in the library's view. Changes of an operation marked
 * `x-stability: experimental` in the earlier document, and every change when the
 * version in the path changes (the servers' `/v1`), are warnings only.
 */

interface Document {
  servers?: Array<{ url: string }>
  paths?: Record<string, Record<string, { operationId?: string; 'x-stability'?: string }>>
}

export interface Compatibility {
  /** Breaking changes of stable operations: each names the operation and the change. */
  breaking: string[]
  /** Breaking changes that are allowed (experimental operations, a new path version). */
  warnings: string[]
}

const METHODS = new Set(['get', 'put', 'post', 'delete', 'options', 'head', 'patch', 'trace'])

/** The version segment of the first server URL (`/v1`), which clients put in every path. */
export function pathVersion (document: Document): string | undefined {
  return /\/v\d+(?=\/|$)/.exec(document.servers?.[0]?.url ?? '')?.[0]
}

/** A code added to an error response's Error code enum: the code set is open (docs/api.md), clients go by status. */
function addsErrorCode (path: Array<string | number>, action: string): boolean {
  return (
    action === 'add' &&
    path[3] === 'responses' &&
    Number(path[4]) >= 400 &&
    path.slice(-3, -1).join('.') === 'code.enum'
  )
}

/** A removed member of a response body's schema: `paths/<path>/<method>/responses/<status>/.../properties/<name>`. */
function removesResponseMember (path: Array<string | number>): boolean {
  return path[3] === 'responses' && path.at(-2) === 'properties'
}

export function compareDocuments (before: Document, after: Document): Compatibility {
  const { diffs } = apiCompare(before, after)
  const result: Compatibility = { breaking: [], warnings: [] }
  const versionBefore = pathVersion(before)
  const versionAfter = pathVersion(after)
  const newVersion = versionBefore !== versionAfter
  for (const diff of diffs) {
    // Changes to components show up again where operations use them, with the operation named.
    if (diff.path[0] !== 'paths') continue
    const removedMember = diff.type !== 'breaking' && diff.action === 'remove' && removesResponseMember(diff.path)
    if (diff.type !== 'breaking' && !removedMember) continue
    const [, path = '', method = ''] = diff.path.map(String)
    // A removed path removes each of its operations, each with its own stability.
    const methods = METHODS.has(method) ? [method] : Object.keys(before.paths?.[path] ?? {}).filter(m => METHODS.has(m))
    for (const each of methods) {
      const operation = before.paths?.[path]?.[each] ?? after.paths?.[path]?.[each]
      const name = `${operation?.operationId ?? '(no operationId)'} (${each.toUpperCase()} ${path})`
      const what = removedMember
        ? `[Removed] member \`${String(diff.path.at(-1))}\` of the ${String(diff.path[4])} response body`
        : METHODS.has(method)
          ? (diff.description ?? `[${diff.action}]`)
          : `[Removed] operation ${each.toUpperCase()} ${path}`
      const where = diff.path.slice(3).join('.')
      const line = `${name}: ${what}${where === '' ? '' : ` [${where}]`}`
      if (addsErrorCode(diff.path, diff.action)) {
        result.warnings.push(`${line} (allowed: a new error code; clients handle unknown codes by their status)`)
      } else if (newVersion) {
        result.warnings.push(
          `${line} (allowed: the path version changes from ${versionBefore ?? 'none'} to ${versionAfter ?? 'none'})`
        )
      } else if (operation?.['x-stability'] === 'experimental') {
        result.warnings.push(`${line} (allowed: the operation is x-stability: experimental)`)
      } else {
        result.breaking.push(line)
      }
    }
  }
  return { breaking: [...new Set(result.breaking)], warnings: [...new Set(result.warnings)] }
}
