package bench

import (
	"math/rand/v2"
	"strings"
)

// words are common short English words. Each, with the space before it,
// is one token in the Llama, Mistral, Qwen and GPT vocabularies, so a
// prompt of n of them is about n tokens on any server without the
// benchmark having to load the server's tokenizer. A model with a small
// vocabulary (the bundled stories260K has 512 tokens) splits them further;
// the report counts what the server said it read.
var words = strings.Fields(`
the of and to in is was for that on with as by at from his her their they
this have had are not but be been one all were when there which she he we
can will would who more out up so what about time some into has them than
two other new its only over first may after also made most any these many
then people way could well even back where much year day good work life
world man state great under never old little house part same place long
down through last right while each both found small hand own must high
water might city still home name need big just end open form light point
black white green blue red king town road tree sun sea land story music
book game child family friend night morning heart mind body river table
door window garden street field letter voice color horse bird fish dog
cat food bread milk apple stone fire rain snow wind cloud star moon sky
river hill wall bed room chair paper money power war peace law court art
school class student teacher doctor market price trade plan idea fact
question answer reason result change order group number line side kind
word sound picture story film show play song dance team ball race car
train ship plane bridge island forest mountain village country north
south east west summer winter spring autumn early late fast slow happy
sad young strong short warm cold dark clear full free hard easy simple
`)

// Prompt returns n words drawn from the fixed list. A new random start
// per prompt keeps servers with a prefix cache from serving later prompts
// out of earlier ones.
func Prompt(rng *rand.Rand, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[rng.IntN(len(words))])
	}
	return b.String()
}
