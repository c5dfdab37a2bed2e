package main

import (
	"fmt"
	"math/rand/v2"
)

// User is a row of the users table, the source of truth.
type User struct {
	ID      string
	Email   string
	Country string
	Score   float64
}

// generate returns yesterday's and today's users, deterministically. Today
// every 10th user was deleted, every 7th changed email, every 6th moved to
// France, nobody lives in Brazil any more (they moved to the US), every
// 11th has a blank email (not indexed, as Familia skips blank values), and
// a tenth of the users are new.
func generate(n int) (yesterday, today []User) {
	rng := rand.New(rand.NewPCG(1, 2))
	countries := []string{"fr", "de", "us", "jp", "br"}
	for i := range n * 9 / 10 {
		yesterday = append(yesterday, User{
			ID:      userID(i),
			Email:   fmt.Sprintf("user%d@old.example", i),
			Country: countries[i%len(countries)],
			Score:   float64(rng.IntN(1000)),
		})
	}
	for i := range n {
		if deleted(i) {
			continue
		}
		u := User{ID: userID(i), Email: fmt.Sprintf("user%d@old.example", i), Country: countries[i%len(countries)], Score: float64(rng.IntN(1000))}
		switch {
		case i%11 == 0:
			u.Email = "   "
		case i%7 == 0:
			u.Email = fmt.Sprintf("user%d@new.example", i)
		}
		switch {
		case i%6 == 0:
			u.Country = "fr"
		case u.Country == "br":
			u.Country = "us"
		}
		today = append(today, u)
	}
	return yesterday, today
}

func userID(i int) string { return fmt.Sprintf("u%05d", i) }
func deleted(i int) bool  { return i%10 == 9 }
