import { runFolder } from './helpers/folder.js'

await runFolder(new URL('./operations/', import.meta.url))
