import { runFolder } from './helpers/folder.js'

await runFolder(new URL('./startup/', import.meta.url))
